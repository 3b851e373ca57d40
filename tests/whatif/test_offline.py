"""`smon analyze` (offline.main) and the DESIGN §6 summary object."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import smon_server.offline as offline
from smon_server.views.summary import rank_heatmap, step_series, to_summary, worker_grid
from smon_server.whatif.engine import analyze
from smon_server.whatif.ops import OpTable
from tests.support.synthetic import SyntheticJob, synthetic_table
from tests.whatif.conftest import require_conformance

SUMMARY_FIELDS = {
    "job_id", "world_size", "steps_seen", "slowdown", "waste_fraction", "gpu_hours_wasted",
    "simulation_discrepancy", "m_w", "m_s", "attribution", "stragglers", "diagnoses",
    "state", "from_step", "to_step", "warmup_steps", "estimator", "discrepancy_flagged",
}  # fmt: skip


def write_parquet(t: OpTable, path: Path) -> Path:
    """An op table in the conformance trace schema."""
    names = pa.array([t.op_types[i] for i in t.op_type.tolist()]).dictionary_encode()
    pq.write_table(
        pa.table(
            {
                "dp_rank": t.dp_rank,
                "stage": t.stage,
                "rank": t.rank,
                "step": t.step,
                "optype": names,
                "start_ts": t.start,
                "duration": t.duration,
                "seq_id": t.seq_id,
                "mc": t.chunk,
                "mb_id": t.microbatch,
            }
        ),
        path,
    )
    return path


def check_summary(s: dict) -> None:
    assert set(s) >= SUMMARY_FIELDS
    json.dumps(s, allow_nan=False)
    assert set(s["attribution"]) == {"by_op_type", "by_dp_rank", "by_stage"}
    assert all(isinstance(k, str) for k in s["attribution"]["by_dp_rank"])
    slow = [w["slowdown"] for w in s["stragglers"]]
    assert slow == sorted(slow, reverse=True)
    for w in s["stragglers"]:
        assert set(w) == {"rank", "host", "dp_rank", "stage", "slowdown", "cause", "evidence"}
    shares = [d["share"] for d in s["diagnoses"]]
    assert shares == sorted(shares, reverse=True)
    for d in s["diagnoses"]:
        assert set(d) == {"cause", "share", "confidence", "evidence", "recommendation"}


def test_json_on_a_conformance_trace() -> None:
    d = require_conformance()
    out = io.StringIO()
    assert offline.main(str(d / "trace-AR.parquet"), str(d / "meta-AR.yaml"), as_json=True, out=out) == 0
    s = json.loads(out.getvalue())
    check_summary(s)
    assert (s["job_id"], s["world_size"], s["steps_seen"]) == ("AR", 64, 44)
    assert s["stragglers"][0]["dp_rank"] == 0 and s["stragglers"][0]["stage"] == 0
    assert s["diagnoses"][0]["cause"] == "slow_worker"
    assert s["gpu_hours_wasted"] > 0


def test_report_on_a_synthetic_trace(tmp_path: Path) -> None:
    job = SyntheticJob(dp=4, pp=2, microbatches=4, steps=5, slow_workers={(1, 0): 1.8})
    path = write_parquet(synthetic_table(job), tmp_path / "trace-demo.parquet")
    out = io.StringIO()
    assert offline.main(str(path), None, as_json=False, out=out) == 0
    text = out.getvalue()
    assert "demo" in text and "slowdown S" in text and "slow_worker" in text and "M_W" in text
    summary, result, _ = offline.analyze_file(path)
    check_summary(summary)
    assert summary["world_size"] is None
    assert summary["slowdown"] == pytest.approx(result.slowdown)


def test_bad_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert offline.main(str(tmp_path / "missing.parquet")) == 2
    assert "does not exist" in capsys.readouterr().err


def test_views_without_attribution() -> None:
    r = analyze(synthetic_table(SyntheticJob(dp=2, steps=3, jitter=0.0)))
    s = to_summary(r, job_id="x")
    check_summary(s)
    assert s["m_w"] is None and s["attribution"]["by_op_type"] == {} and s["stragglers"] == []
    assert worker_grid(r)["values"] == [[None], [None]]
    assert [p["step"] for p in step_series(r).rows()] == [0, 1, 2]
    heat = rank_heatmap(r, {(0, 0): [0, 1], (1, 0): [2, 3]})
    assert heat.ranks.tolist() == [0, 1, 2, 3] and np.isnan(heat.values[0]).all()
    assert heat.values.shape == (4, 3)
