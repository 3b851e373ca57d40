"""End to end: each framework's one-line integration in a real 2-rank job (torchrun, gloo, CPU),
a real server on loopback: Hugging Face Trainer, Accelerate, Lightning's DDP strategy, DeepSpeed
ZeRO-1.

Each job trains three times (jobs.py): a healthy run must name nobody, a run with one rank
sleeping in every training forward must name that rank with its cause, the framework's own
evaluation, checkpoint saving and logging must arrive as the phases `eval`, `checkpoint` and
`log`, and the healthy run's losses and weights must equal those of the same run without SMon.
"""

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
from tests.e2e.processes import run_job_command
from tests.support.paths import REPO_ROOT
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow]

HERE = Path(__file__).parent
STEPS = 16  # optimizer steps per run (the jobs' STEPS), each of 2 accumulated micro-batches
DELAY = 0.08  # the straggler's sleep per training forward: 0.16 s per step on a ~0.1 s step


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('frameworks') / 'smon.db'}"
    settings = server_settings(url, analysis_interval=3600, analysis_workers=0, warmup_steps=3)
    with BackgroundServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def reports(live_server: BackgroundServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One torchrun launch runs every framework's job (all_jobs.py): one process group and one
    import of each framework for the four, the slowest part of each job. {prefix, reports, log}."""
    out = tmp_path_factory.mktemp("jobs")
    prefix = f"fw-{time.time_ns()}"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(HERE / "all_jobs.py"), str(out), prefix, "--slow-rank", "1", "--delay", str(DELAY),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "SMON_SERVER": live_server.grpc_target,
        # A run's last steps reach the server before the next run starts, however loaded the
        # machine (the shipper process of each run starts while the job runs).
        "SMON_AGENT_FLUSH_TIMEOUT": "30",
        "SMON_LOG_LEVEL": "INFO",
    }
    env.pop("SMON_JOB", None)  # the jobs are named after the frameworks' run names
    done = run_job_command(command, env, timeout=900)
    log = "\n".join(line for line in done.stderr.splitlines() if "smon" in line.lower())
    found = {}
    for framework in ("transformers", "accelerate", "lightning", "deepspeed"):
        path = out / framework / "report.json"
        if path.exists():
            found[framework] = json.loads(path.read_text())
    return {"prefix": prefix, "reports": found, "log": log[-4000:], "failed": done.returncode != 0,
            "stderr": done.stderr[-6000:]}  # fmt: skip


def last_steps(server: BackgroundServer, job: str) -> list[int | None]:
    """Each rank's last stored step (None: nothing from that rank yet)."""
    out: list[int | None] = []
    for rank in (0, 1):
        worker = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/workers/{rank}", timeout=30)
        steps = worker.json().get("steps") if worker.status_code == 200 else None
        out.append(max(s["step"] for s in steps) if steps else None)
    return out


def summary(server: BackgroundServer, job: str, log: str = "") -> dict[str, Any]:
    """Once both ranks' last steps are stored: an analysis pass, then the job's summary."""
    deadline = time.monotonic() + 60
    while (seen := last_steps(server, job)) != [STEPS - 1] * 2:
        if time.monotonic() > deadline:
            pytest.fail(
                f"job {job}: last steps stored per rank {seen}, wanted {STEPS - 1}; SMon said:\n{log}"
            )
        time.sleep(0.2)
    assert server.context is not None
    analysis_pass(server.context, time.time())
    response = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/summary", timeout=30)
    response.raise_for_status()
    return dict(response.json())


def phases_seen(server: BackgroundServer, job: str, rank: int) -> set[str]:
    worker = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/workers/{rank}", timeout=30).json()
    assert "steps" in worker, worker
    return {name for step in worker["steps"] for name in step["phases"]}


def brief(s: dict[str, Any]) -> str:
    keys = ("job_id", "slowdown", "steps_seen", "attribution", "stragglers")
    shown = {k: s.get(k) for k in keys}
    shown["diagnoses"] = [(d["cause"], d["share"], d["evidence"]) for d in s.get("diagnoses", [])]
    return json.dumps(shown, default=str)[:6000]


def check_framework(server: BackgroundServer, jobs: dict[str, Any], framework: str) -> None:
    if framework not in jobs["reports"]:
        pytest.fail(f"the {framework} job did not finish; the job's stderr ends:\n{jobs['stderr']}")
    report, prefix, log = jobs["reports"][framework], f"{jobs['prefix']}-{framework}", jobs["log"]
    healthy, slow = summary(server, f"{prefix}-healthy", log), summary(server, f"{prefix}-slow", log)
    assert healthy["world_size"] == slow["world_size"] == 2
    assert healthy["stragglers"] == [], brief(healthy)
    assert slow["stragglers"], brief(slow)
    straggler = slow["stragglers"][0]
    assert straggler["rank"] == 1, brief(slow)
    assert straggler["cause"] == "slow_worker", brief(slow)
    assert straggler["evidence"]["op_type"] == "forward-compute", brief(slow)
    assert slow["slowdown"] >= 1.1, brief(slow)
    for rank in (0, 1):
        assert {"eval", "checkpoint"} <= phases_seen(server, f"{prefix}-healthy", rank)
    assert "log" in phases_seen(server, f"{prefix}-healthy", 0)  # the main process logs everywhere
    # SMon leaves training alone: the monitored run and the unmonitored one agree exactly.
    assert report["healthy"]["losses"] == report["plain"]["losses"]
    assert report["healthy"]["params"] == report["plain"]["params"]


def test_transformers_trainer(live_server: BackgroundServer, reports: dict[str, Any]) -> None:
    check_framework(live_server, reports, "transformers")


def test_accelerate_loop(live_server: BackgroundServer, reports: dict[str, Any]) -> None:
    check_framework(live_server, reports, "accelerate")


def test_lightning_ddp(live_server: BackgroundServer, reports: dict[str, Any]) -> None:
    check_framework(live_server, reports, "lightning")


def test_deepspeed_engine(live_server: BackgroundServer, reports: dict[str, Any]) -> None:
    check_framework(live_server, reports, "deepspeed")
