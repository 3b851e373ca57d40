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
from tests.conftest import REPO_ROOT, server_settings
from tests.e2e.processes import run_job_command

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


def run_framework_job(script: str, server: BackgroundServer, out: Path, prefix: str) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(HERE / script), str(out), prefix, "--slow-rank", "1", "--delay", str(DELAY),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "SMON_SERVER": server.grpc_target,
        # A run's last steps reach the server before the next run starts, however loaded the
        # machine (the shipper process of each run starts while the job runs).
        "SMON_AGENT_FLUSH_TIMEOUT": "30",
        "SMON_LOG_LEVEL": "INFO",
    }
    env.pop("SMON_JOB", None)  # the jobs are named after the frameworks' run names
    done = run_job_command(command, env, timeout=420)
    assert done.returncode == 0, done.stderr[-6000:]
    report = dict(json.loads((out / "report.json").read_text()))
    report["smon_log"] = "\n".join(line for line in done.stderr.splitlines() if "smon" in line.lower())
    return report


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


def check_framework(server: BackgroundServer, report: dict[str, Any], prefix: str) -> None:
    log = report["smon_log"][-4000:]
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


def test_transformers_trainer(live_server: BackgroundServer, tmp_path: Path) -> None:
    prefix = f"hf-{time.time_ns()}"
    check_framework(live_server, run_framework_job("hf_job.py", live_server, tmp_path, prefix), prefix)


def test_accelerate_loop(live_server: BackgroundServer, tmp_path: Path) -> None:
    prefix = f"accelerate-{time.time_ns()}"
    check_framework(
        live_server, run_framework_job("accelerate_job.py", live_server, tmp_path, prefix), prefix
    )


def test_lightning_ddp(live_server: BackgroundServer, tmp_path: Path) -> None:
    prefix = f"lightning-{time.time_ns()}"
    check_framework(live_server, run_framework_job("lightning_job.py", live_server, tmp_path, prefix), prefix)


def test_deepspeed_engine(live_server: BackgroundServer, tmp_path: Path) -> None:
    prefix = f"deepspeed-{time.time_ns()}"
    check_framework(live_server, run_framework_job("deepspeed_job.py", live_server, tmp_path, prefix), prefix)
