"""Smoke test of `smon_server.demo.loop_train`: every knob at once runs to completion, and a job with
a server is stored. Nothing here is about S (benchmarks/s_accuracy.py measures that)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from tests.e2e.processes import forked, run_job_command
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow]

MODULE = "smon_server.demo.loop_train"
RANKS = 2
STEPS = 30
EVERY_KNOB = [
    "--device-ms", "5",
    "--accum", "2",
    "--eval-every", "10", "--eval-batches", "3",
    "--log-every", "5",
    "--ckpt-every", "10",
    "--workers", "2",
    "--host-rank", "1", "--host-delay", "0.005",
    "--slow-rank", "1", "--delay", "0.005",
    "--slow-data-rank", "0", "--data-delay", "0.005",
    "--gc-rank", "1", "--gc-every", "10",
]  # fmt: skip


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('loop') / 'smon.db'}"
    with BackgroundServer(server_settings(url, analysis_interval=3600)) as server:
        yield server


def run_loop(args: list[str], env: dict[str, str], report: Path) -> subprocess.CompletedProcess[str]:
    command = forked(RANKS, ["--steps", str(STEPS), "--report", str(report), *args], module=MODULE)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return run_job_command(command, full_env, 300)


def test_every_knob_at_once_without_smon(tmp_path: Path) -> None:
    done = run_loop(EVERY_KNOB, {"SMON_DISABLE": "1"}, tmp_path / "report")
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(RANKS):
        times = json.loads((tmp_path / "report" / f"rank{rank}.json").read_text())["step_times"]
        assert len(times) == STEPS
        assert all(t > 0 for t in times)
    logged = [line for line in done.stderr.splitlines() if "[rank 0] step" in line]
    assert sum("eval loss" in line for line in logged) == STEPS // 10
    assert sum(" loss " in line and "eval" not in line for line in logged) == STEPS // 5
    assert f"training finished: {STEPS} steps on {RANKS} ranks" in done.stdout


def test_job_is_stored_by_the_server(live_server: BackgroundServer, tmp_path: Path) -> None:
    job = f"loop-{time.time_ns()}"
    env = {"SMON_SERVER": live_server.grpc_target, "SMON_JOB": job, "SMON_DEMO_QUIET": "1"}
    done = run_loop(["--device-ms", "5", "--accum", "2", "--eval-every", "10"], env, tmp_path / "report")
    assert done.returncode == 0, done.stderr[-4000:]

    url = live_server.http_url
    deadline = time.monotonic() + 30
    jobs: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline:
        jobs = {j["job_id"]: j for j in httpx.get(f"{url}/api/v1/jobs").json()["jobs"]}
        if jobs.get(job, {}).get("last_step") == STEPS - 1:
            break
        time.sleep(0.2)
    assert job in jobs
    assert jobs[job]["world_size"] == RANKS
    assert jobs[job]["last_step"] == STEPS - 1  # one step per optimizer step, not per micro-step

    assert live_server.context is not None
    analysis_pass(live_server.context, time.time())
    summary = httpx.get(f"{url}/api/v1/jobs/{job}/summary", timeout=30).json()
    assert summary["steps_seen"] > 0
