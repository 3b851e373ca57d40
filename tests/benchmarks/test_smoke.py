"""Every benchmark runs, at a tiny size, in `make test`: a change that breaks one fails CI instead
of being found months later (api_latency.py crashed for weeks after jobs gained attempts, and the
figures docs quoted from it could not be re-measured). The figures of a smoke run mean nothing;
the test asserts the script ran to its report, so even those that run real torch jobs run in the
parallel pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.tools import debian_tool

BENCHMARKS = REPO_ROOT / "benchmarks"
PARALLEL = pytest.mark.parallel


@dataclass(frozen=True)
class Smoke:
    script: str
    args: str  # command-line arguments, split on spaces
    # A line of the report the script prints last: it ran to the end, not just started.
    expect: str
    marks: tuple[pytest.MarkDecorator, ...] = ()


SMOKES = [
    Smoke("whatif_speed.py", "--quick", "cost is linear in ops"),
    Smoke("gpu_overhead.py", "--fake --rounds 2 --block 2", "target: smon"),
    Smoke(
        "analysis_pass.py",
        "--ranks 8 --steps 20 --new-steps 2 --jobs 2 --job-ranks 4 --workers 1 --baseline none",
        "CPU s, every pass",
    ),
    Smoke("api_latency.py", "--jobs 1 --ranks 4 --requests 4 --old-runs 1", "phase columns:"),
    Smoke("hosts_latency.py", "--hosts 20 --incidents 50 --requests 2", "GET /metrics"),
    Smoke("ingest.py", "--agents 2 --jobs 1 --batches 2 --rounds 1", "raw COPY"),
    Smoke("fleet.py", "--agents 10 --duration 2 --warmup 1", "largest fleet sustained"),
    Smoke(
        "fleet_job.py",
        "--ranks 8 --duration 3 --warmup 1 --analysis-interval 1 --poll 1 --straggler-at 2",
        "named in the recent stretch",
    ),
    Smoke("dashboard_load.py", "--ranks 8 --jobs 1 --runs 1", "navigation -> heatmap drawn"),
    # Real torch jobs, but a smoke run asserts only that the script reached its report: parallel.
    Smoke(
        "time_to_flag.py", "--ranks 2 --onset 5 --after 3", "before the onset", (pytest.mark.torch, PARALLEL)
    ),
    Smoke(
        "s_accuracy.py",
        "--quick --cases slow_forward --steps 12",
        "truth: straggling",
        (pytest.mark.torch, PARALLEL),
    ),
    Smoke(
        "agent_overhead.py",
        "--rounds 1 --tiny-steps 20 --ddp-tiny-rounds 0 --ddp-rounds 0 --background-steps 500",
        "calls per step",  # single-process loops (no DDP job here): in the parallel pass
    ),
]


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py")} - {"__init__.py", "bench_db.py"}
    assert scripts == {s.script for s in SMOKES}, "a benchmark without a smoke run (or one run twice)"


@pytest.mark.parametrize(
    "smoke", [pytest.param(s, marks=s.marks, id=s.script.removesuffix(".py")) for s in SMOKES]
)
def test_benchmark_runs(smoke: Smoke) -> None:
    if smoke.script == "dashboard_load.py":
        debian_tool("chromium", "chromium")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(REPO_ROOT / p) for p in ("", "agent", "server"))}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / smoke.script), *smoke.args.split()],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{smoke.script} exited {done.returncode}:\n{output[-3000:]}"
    assert smoke.expect in output, f"{smoke.script} did not reach its report:\n{output[-3000:]}"
