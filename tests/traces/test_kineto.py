"""Profiler traces offline: the Kineto reader on built traces, and `smon analyze DIR` on the real
H200 traces in ../shared/traces/h200-gloo-ddp2 with their stated truth."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

import smon_server.offline as offline
from smon_server.whatif.inputs.kineto import is_nccl_kernel, load_profile
from smon_server.whatif.inputs.trace import TraceError
from tests.support.paths import shared_dir, skip_or_fail
from tests.traces.kineto_builder import RankTraceDoc, Step

MS = 1e-3


def spans(folder: Path, rank: int = 0, step: int = 1) -> dict[str, tuple[float, float]]:
    """{kind: (offset ms, duration ms)} of one rank's step, as the reader made it."""
    cols = load_profile(folder).columns
    record = next(i for i in range(len(cols)) if cols.rank[i] == rank and cols.step[i] == step)
    mine = cols.span_record == record
    return {
        cols.kinds[k]: (round(a / MS, 3), round(d / MS, 3))
        for k, a, d in zip(cols.span_kind[mine], cols.span_start[mine], cols.span_duration[mine], strict=True)
    }


def write_ranks(folder: Path, ranks: int = 2, **options: object) -> Path:
    for r in range(ranks):
        RankTraceDoc(rank=r, world_size=ranks, steps=[Step() for _ in range(4)], **options).write(folder)  # type: ignore[arg-type]
    return folder


@pytest.mark.parametrize("collective", ["ncclKernel", "ncclDevKernel", "gloo", "record_param_comms"])
def test_every_collective_name_gives_the_exposed_sync(tmp_path: Path, collective: str) -> None:
    """NCCL kernels under their old and new names (HTA#360: the rename hid every collective),
    ProcessGroup annotations and record_param_comms all end the step's gradient sync."""
    found = spans(write_ranks(tmp_path, collective=collective, gpu=collective.startswith("nccl")))
    assert found["grad_sync"][1] == pytest.approx(4.0, abs=0.01)  # Step.sync
    assert found["backward"][1] == pytest.approx(19.9, abs=0.01)
    assert found["grad_sync"][0] == pytest.approx(found["backward"][0] + found["backward"][1], abs=0.01)
    assert found["forward"][1] == pytest.approx(9.99, abs=0.01)
    assert found["optimizer"][1] == pytest.approx(1.96, abs=0.01)


def test_nccl_kernel_names() -> None:
    assert is_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_float")
    assert is_nccl_kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL")
    assert not is_nccl_kernel("void at::native::vectorized_elementwise_kernel<4>")


def test_gpu_phases_last_until_their_kernels_end(tmp_path: Path) -> None:
    """On the device clock a phase ends where its last kernel does (as a CUDA event would)."""
    steps = [Step(forward_kernels=3.0) for _ in range(4)]
    RankTraceDoc(rank=0, world_size=1, steps=steps, gpu=True, collective="ncclDevKernel").write(tmp_path)
    found = spans(tmp_path)
    assert found["forward"][1] == pytest.approx(9.99 + 3.0 - 0.01, abs=0.02)
    # backward's first op was launched while the forward kernels still ran: it starts after them
    assert found["backward"][0] == pytest.approx(found["forward"][0] + found["forward"][1], abs=0.02)


def test_forward_without_an_annotation_runs_to_the_first_autograd_op(tmp_path: Path) -> None:
    found = spans(write_ranks(tmp_path, ranks=1, annotate_forward=False))
    assert found["forward"] == pytest.approx((0.0, 10.05), abs=0.01)


def test_gzipped_and_plain_traces_read_the_same(tmp_path: Path) -> None:
    for r in range(2):
        doc = RankTraceDoc(rank=r, world_size=2, steps=[Step() for _ in range(4)])
        doc.write(tmp_path / "plain")
        RankTraceDoc(rank=r, world_size=2, steps=[Step() for _ in range(4)]).write(tmp_path / "gz", gz=True)
    plain, packed = load_profile(tmp_path / "plain").columns, load_profile(tmp_path / "gz").columns
    assert plain.span_duration.tolist() == packed.span_duration.tolist()
    assert plain.rank.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_bad_files_are_counted_and_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_ranks(tmp_path)
    (tmp_path / "notes.json").write_text('{"step_seconds": [0.1]}')
    (tmp_path / "broken.pt.trace.json").write_text('{"traceEvents": [')
    (tmp_path / "nosteps.json").write_text(
        json.dumps({"traceEvents": [{"ph": "X", "name": "x", "ts": 1, "dur": 1}]})
    )
    with gzip.open(tmp_path / "cut.json.gz", "wb") as f:
        f.write(b'{"traceEvents": [')
    profile = load_profile(tmp_path)
    assert [t.rank for t in profile.ranks] == [0, 1]
    assert len(profile.files_rejected) == 4
    summary, _, _ = offline.analyze_file(tmp_path)
    assert summary["data_quality"]["files_rejected"] == 4
    assert summary["steps_seen"] >= 2
    assert "no ProfilerStep#N" in capsys.readouterr().err


def test_a_folder_without_a_usable_trace_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.json").write_text("not json")
    with pytest.raises(TraceError, match="no usable profiler trace"):
        load_profile(tmp_path)
    assert offline.main(tmp_path, out=io.StringIO()) == 2
    assert "no usable profiler trace" in capsys.readouterr().err
    assert offline.main(tmp_path / "missing", out=io.StringIO()) == 2


# -- the real H200 traces (README there: rank 1 sleeps 10 ms before each forward; 1.165 slower) ----

FIXTURES = "traces/h200-gloo-ddp2"


def fixture_set(tmp_path: Path, name: str) -> Path:
    """A folder holding one set's traces (links to ../shared: read there, never copied)."""
    source = shared_dir() / FIXTURES
    files = sorted(source.glob(f"{name}-rank*.pt.trace.json.gz"))
    if len(files) < 2:
        skip_or_fail(f"{source} lacks the {name} traces")
    folder = tmp_path / name
    folder.mkdir()
    for f in files:
        (folder / f.name).symlink_to(f)
    return folder


def measured_slowdown() -> float:
    """The README's truth: the slow set's mean profiled step over the clean set's."""

    def mean_step(name: str) -> float:
        times = []
        for path in sorted((shared_dir() / FIXTURES).glob(f"{name}-truth-rank*.json")):
            truth = json.loads(path.read_text())
            times += [truth["step_seconds"][i] for i in truth["profiled_steps"]]
        return sum(times) / len(times)

    return mean_step("gloo2-rank1slow") / mean_step("gloo2-clean")


def test_h200_straggler_named_in_forward(tmp_path: Path) -> None:
    out = io.StringIO()
    assert offline.main(fixture_set(tmp_path, "gloo2-rank1slow"), as_json=True, out=out) == 0
    summary = json.loads(out.getvalue())
    assert summary["estimator"] == "robust"
    assert summary["world_size"] == 2
    assert [s["rank"] for s in summary["stragglers"]] == [1], summary["stragglers"]
    assert summary["stragglers"][0]["cause"] == "slow_worker"
    assert summary["stragglers"][0]["evidence"]["op_type"] == "forward-compute"
    assert summary["diagnoses"][0]["cause"] == "slow_worker"
    truth = measured_slowdown()
    assert truth == pytest.approx(1.165, abs=0.005)
    assert summary["slowdown"] == pytest.approx(truth, rel=0.05)
    assert summary["simulation_discrepancy"] == pytest.approx(1.0, abs=0.02)


def test_h200_clean_set_names_nobody(tmp_path: Path) -> None:
    summary, _, _ = offline.analyze_file(fixture_set(tmp_path, "gloo2-clean"))
    assert summary["stragglers"] == []
    assert summary["diagnoses"] == []
    assert summary["slowdown"] < 1.05


def test_h200_report_renders(tmp_path: Path) -> None:
    out = io.StringIO()
    assert offline.main(fixture_set(tmp_path, "gloo2-rank1slow"), out=out) == 0
    text = out.getvalue()
    assert "gloo2-rank1slow" in text and "slow_worker" in text and "forward-compute" in text
