"""End to end, device time hidden behind the host (issue 29): real 2-rank gloo jobs whose ranks
each drive a simulated GPU (tests/e2e/device_time_train.py), timed by the agent's CUDA-event path.

Rank 1 queues an extra kernel at the start of its forward. Within the host's slack it costs the
job nothing (its own step times say so): SMon reads S <= 1.03 and names nobody, while the stored
forward phase of rank 1 still shows the device time it took. Past the slack the job slows down,
and SMon names rank 1 with S within 10% of the truth measured against the same job without it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smon_server.runtime import BackgroundServer
from tests.e2e.test_ddp_jobs import analysed_summary, brief, own_step_times, run_job
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow]

MODULE = "tests.e2e.device_time_train"
STEPS = 60
RANKS = 2


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('device') / 'smon.db'}"
    with BackgroundServer(server_settings(url, analysis_interval=3600, analysis_workers=1)) as server:
        yield server


def job(server: BackgroundServer, spin_ms: float, report: Path) -> tuple[dict[str, Any], float]:
    """The job's summary and its own mean step time."""
    name = f"device-{spin_ms:g}-{time.time_ns()}"
    env = {"SMON_SERVER": server.grpc_target, "SMON_JOB": name}
    args = ["--spin-rank", "1", "--spin-ms", str(spin_ms)]
    done = run_job(args, env=env, report=report, module=MODULE, steps=STEPS, ranks=RANKS)
    assert done.returncode == 0, done.stderr[-4000:]
    return analysed_summary(server, name, STEPS), statistics.mean(own_step_times(report))


def forward_means(server: BackgroundServer, job_id: str) -> list[float]:
    out = []
    for rank in range(RANKS):
        steps = httpx.get(f"{server.http_url}/api/v1/jobs/{job_id}/workers/{rank}").json()["steps"][10:]
        out.append(statistics.mean(s["phases"]["forward"] for s in steps))
    return out


def test_a_kernel_the_host_hides_costs_nothing_and_one_past_its_slack_is_measured(
    live_server: BackgroundServer, tmp_path: Path
) -> None:
    clean, clean_time = job(live_server, 0.0, tmp_path / "clean")
    hidden, hidden_time = job(live_server, 12.0, tmp_path / "hidden")
    exposed, exposed_time = job(live_server, 45.0, tmp_path / "exposed")

    # A healthy job on this shared 2-core machine reads S a little above 1 from scheduling jitter
    # alone (1.00-1.05); the hidden kernel (a third of the step on rank 1's device) adds nothing.
    assert clean["slowdown"] < 1.1 and clean["stragglers"] == [], brief(clean)

    # Within the host's slack (12 ms of host forward + 20 of backward against 9 of kernels).
    assert hidden_time == pytest.approx(clean_time, rel=0.05)
    assert hidden["slowdown"] <= max(1.03, clean["slowdown"] + 0.03), (brief(hidden), brief(clean))
    assert hidden["stragglers"] == [], brief(hidden)
    notes = {n["kind"]: n for n in hidden["data_quality_notes"]}
    assert notes["device_time_behind_host"]["count"] > 0  # the summary says how it read them
    fast, slow = forward_means(live_server, hidden["job_id"])
    # The forward phase shown is still the device's: rank 1's ends when its kernels do, 15 ms in,
    # 3 ms past the host's 12 ms of issuing it (rank 0's ends with the host's).
    assert slow - fast > 0.002

    # Past it: the step waits for rank 1's device.
    truth = exposed_time / clean_time
    assert truth > 1.2
    assert exposed["stragglers"] and exposed["stragglers"][0]["rank"] == 1, brief(exposed)
    assert exposed["slowdown"] == pytest.approx(truth, rel=0.10), brief(exposed)
