"""End to end: a real 4-rank gloo DDP job restarted under the same job id, against a real server on
PostgreSQL. A torchrun elastic restart (a rank fails once, `--max-restarts 1`) and a resubmission
(the same job id run again, steps from 0) each report into a new attempt; a straggler injected in
the first attempt only is named there and not in the second."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from tests.e2e.processes import forked, run_job_command
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.postgres]

RANKS = 4
WARMUP = 10  # SMON_WARMUP_STEPS' default, after every start and restart
SLOW_RANK = 2
ELASTIC = Path(__file__).with_name("elastic_train.py")


@pytest.fixture
def live_server(postgres_url: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(
        server_settings(postgres_url, analysis_interval=3600, analysis_workers=1)
    ) as server:
        yield server


def job_env(server: BackgroundServer, job: str) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SMON_DEMO_QUIET": "1",
        "SMON_SERVER": server.grpc_target,
        "SMON_JOB": job,
        "SMON_NVML_INTERVAL": "0",
    }


def analysed(server: BackgroundServer, job: str, newest_last_step: int) -> list[dict[str, Any]]:
    """Wait until the newest attempt's last step is stored, analyse, and list the attempts."""
    deadline = time.monotonic() + 30
    listed: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        response = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/attempts", timeout=30)
        listed = response.json()["attempts"] if response.status_code == 200 else []
        if listed and listed[0]["last_step"] == newest_last_step:
            break
        time.sleep(0.2)
    assert server.context is not None
    analysis_pass(server.context, time.time())
    return listed


def summary(server: BackgroundServer, job: str, attempt: int | None = None) -> dict[str, Any]:
    params = {} if attempt is None else {"attempt": attempt}
    response = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/summary", params=params, timeout=30)
    response.raise_for_status()
    return dict(response.json())


def brief(s: dict[str, Any]) -> str:
    keys = ("attempt", "from_step", "to_step", "slowdown", "stragglers")
    return json.dumps({k: s.get(k) for k in keys}, default=str)[:3000]


def test_a_torchrun_elastic_restart_is_a_new_attempt(live_server: BackgroundServer) -> None:
    job = f"elastic-{time.time_ns()}"
    fail_at, resume_at, steps = 30, 25, 40
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={RANKS}",
        "--max-restarts=1",
        str(ELASTIC),
        f"--fail-at={fail_at}",
        f"--resume-at={resume_at}",
        f"--steps={steps}",
        f"--slow-rank={SLOW_RANK}",
    ]
    done = run_job_command(command, job_env(live_server, job), timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "failing at step 30" in done.stderr  # it did fail once, and torchrun restarted it

    listed = analysed(live_server, job, resume_at + steps - 1)
    assert [(a["attempt"], a["reported_attempt"]) for a in listed] == [(2, 1), (1, 0)], listed
    assert listed[1]["state"] == "finished" and listed[1]["last_step"] >= fail_at - 1

    restarted = summary(live_server, job)
    assert (restarted["attempt"], restarted["attempts"]) == (2, 2)
    assert restarted["from_step"] >= resume_at + WARMUP and restarted["to_step"] == resume_at + steps - 1
    assert restarted["stragglers"] == [] and restarted["slowdown"] < 1.1, brief(restarted)
    first = summary(live_server, job, attempt=1)
    assert first["to_step"] <= fail_at - 1  # the failed step was never complete
    assert first["stragglers"][0]["rank"] == SLOW_RANK and first["slowdown"] >= 1.1, brief(first)


def test_a_resubmitted_job_is_a_new_attempt(live_server: BackgroundServer) -> None:
    job = f"resubmitted-{time.time_ns()}"
    steps = 35
    for args in (["--slow-rank", str(SLOW_RANK), "--delay", "0.04"], []):  # slow first, then healthy
        command = forked(RANKS, ["--steps", str(steps), "--device-ms", "40", *args])
        done = run_job_command(command, job_env(live_server, job), timeout=240)
        assert done.returncode == 0, done.stderr[-4000:]

    listed = analysed(live_server, job, steps - 1)
    assert [(a["attempt"], a["last_step"]) for a in listed] == [(2, steps - 1), (1, steps - 1)], listed
    second = summary(live_server, job)
    assert (second["attempt"], second["from_step"], second["to_step"]) == (2, WARMUP, steps - 1), brief(
        second
    )
    assert second["stragglers"] == [] and second["slowdown"] < 1.1, brief(second)
    first = summary(live_server, job, attempt=1)
    assert first["stragglers"][0]["rank"] == SLOW_RANK and first["slowdown"] >= 1.1, brief(first)
