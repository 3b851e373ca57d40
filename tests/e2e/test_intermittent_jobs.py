"""End to end: stragglers that come and go, on real gloo DDP jobs of 2 and 4 ranks (issue 29).

- A slow data loader on rank 1 whose two prefetching workers run dry: each batch costs rank 1's
  dataset 2.5 clean steps, so rank 1 waits a whole batch on some steps and nothing on others.
  SMon must name rank 1 with `data_loader` and read S within 10% of the truth (the job's mean
  iteration time over the same job without the delay, run right before it).
- Periodic work on rank 0 alone (10 evaluation batches every 10 steps): rank 0 is named with
  `host_work`, and the ranks that only wait for it carry S_w <= 1.05.

`smon_server.demo.loop_train` runs under torchrun with simulated device time (30 ms a forward), so
the injected effects are tens of percent of a step while the CPU the ranks need stays small on this
shared 2-core machine. Margins: the data truth is asserted > 1.2 (the injection is material) and
the pattern intermittent (rank 1 waits on some steps, not on most or all); S/truth within 10%
(healthy jobs here read S 1.00-1.05; the straggler costs 30-45%).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smon_server.runtime import BackgroundServer
from tests.e2e.test_ddp_jobs import analysed_summary, brief
from tests.e2e.test_ddp_jobs import run_job as ddp_run_job
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow]

MODULE = "smon_server.demo.loop_train"
STEPS = 50
BASE = ["--device-ms", "30", "--workers", "2"]
BATCH_IN_CLEAN_STEPS = 2.5  # rank 1's dataset time per batch, in clean steps (the issue's case)


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('intermittent') / 'smon.db'}"
    with BackgroundServer(server_settings(url, analysis_interval=3600, analysis_workers=1)) as server:
        yield server


def run_job(
    server: BackgroundServer, name: str, ranks: int, args: list[str], report: Path
) -> tuple[str, dict[str, Any], list[float]]:
    """Run the loop to the end and analyse it: (job id, summary, iteration times after warm-up)."""
    job = f"{name}-{ranks}r-{time.time_ns()}"
    env = {"SMON_SERVER": server.grpc_target, "SMON_JOB": job}
    done = ddp_run_job(
        [*BASE, *args], env=env, report=report, timeout=300, module=MODULE, steps=STEPS, ranks=ranks
    )
    assert done.returncode == 0, done.stderr[-4000:]
    per_rank = [json.loads(p.read_text())["step_times"] for p in sorted(report.glob("rank*.json"))]
    times = [statistics.fmean(ts) for ts in zip(*per_rank, strict=True)][10:]
    return job, analysed_summary(server, job, steps=STEPS), times


def data_wait_by_rank(server: BackgroundServer, job: str) -> dict[int, list[float]]:
    """Each rank's recorded data wait per analysed step, from the phase heatmap."""
    url = f"{server.http_url}/api/v1/jobs/{job}/heatmap"
    grid = httpx.get(url, params={"metric": "data_wait"}, timeout=30).json()
    steps = grid["steps"]
    return {
        int(rank): [v or 0.0 for step, v in zip(steps, row, strict=True) if step >= 10]
        for rank, row in zip(grid["ranks"], grid["values"], strict=True)
    }


@pytest.mark.parametrize("ranks", [2, 4])
def test_data_loader_running_dry_on_one_rank(
    ranks: int, live_server: BackgroundServer, tmp_path: Path
) -> None:
    # The clean job runs right before the straggling one: on a shared machine the load drifts
    # over minutes, and a baseline taken earlier moved the truth by 20-30%.
    _, clean_summary, clean_times = run_job(live_server, "clean", ranks, [], tmp_path / "clean")
    clean = statistics.fmean(clean_times)
    delay = BATCH_IN_CLEAN_STEPS * clean
    args = ["--slow-data-rank", "1", "--data-delay", f"{delay:.4f}"]
    job, summary, times = run_job(live_server, "dataslow", ranks, args, tmp_path / "slow")
    truth = statistics.fmean(times) / clean
    assert truth > 1.2, truth  # the injection is material, or the test proves nothing
    # The pattern is the issue's: rank 1 waits a long time on some steps and hardly at all on
    # others (its workers' prefetch runs dry), not a steady wait every step.
    waits = data_wait_by_rank(live_server, job)[1]
    long_waits = sum(w > 0.25 * clean for w in waits) / len(waits)
    assert 0.1 <= long_waits <= 0.8, (long_waits, waits)
    # S is measured against SMon's healthy ideal, the truth against the clean job, which on a
    # loaded machine is itself above that ideal by its own S (stalls every rank shares, beyond
    # the jitter envelope): like for like, S is the truth times the clean job's S. On a quiet
    # machine the clean job reads 1.00-1.02 and this is the plain 10% (s_accuracy.py prints both).
    expected = truth * clean_summary["slowdown"]
    assert summary["slowdown"] == pytest.approx(expected, rel=0.10), (
        truth,
        clean_summary["slowdown"],
        brief(summary),
    )
    assert summary["slowdown"] == pytest.approx(truth, rel=0.25), (truth, brief(summary))
    assert [(s["rank"], s["cause"]) for s in summary["stragglers"]] == [(1, "data_loader")], brief(summary)
    assert summary["stragglers"][0]["evidence"]["op_type"] == "data_wait"
    lead = summary["diagnoses"][0]
    assert lead["cause"] == "data_loader", brief(summary)
    assert [w["rank"] for w in lead["evidence"]["workers"]] == [1]


@pytest.mark.parametrize("ranks", [2, 4])
def test_periodic_work_on_rank0_blames_rank0_alone(
    ranks: int, live_server: BackgroundServer, tmp_path: Path
) -> None:
    # Rank 0 alone evaluates 10 batches (10 x 30 ms of device time) after every 10th step: ~30 ms
    # a step on average, a quarter of a step; every other rank waits for it at the next all-reduce.
    # (S against the truth for this case: test_loop_jobs and benchmarks/s_accuracy.py.)
    args = ["--eval-every", "10", "--eval-batches", "10"]
    job, summary, _ = run_job(live_server, "periodic", ranks, args, tmp_path)
    assert summary["slowdown"] > 1.1, brief(summary)
    assert [(s["rank"], s["cause"]) for s in summary["stragglers"]] == [(0, "host_work")], brief(summary)
    evidence = summary["stragglers"][0]["evidence"]
    assert evidence["op_type"] in ("eval", "host")
    assert evidence["every_n_steps"] == 10
    assert summary["diagnoses"][0]["cause"] == "host_work"
    grid = httpx.get(f"{live_server.http_url}/api/v1/jobs/{job}/workers", timeout=30).json()
    s_w = {dp: row[0] for dp, row in zip(grid["dp_ranks"], grid["values"], strict=True)}
    assert s_w[0] >= 1.1, grid
    waiting = {dp: v for dp, v in s_w.items() if dp != 0}
    assert max(waiting.values()) <= 1.05, (waiting, brief(summary))
