"""`smon analyze DIR` on profiler traces recorded here, by real 2- and 4-rank DDP jobs (gloo, CPU)
with one rank sleeping in every forward (profiler_job.py). Recorded once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import smon_server.offline as offline
from tests.e2e.processes import forked, run_job_command
from tests.support.paths import REPO_ROOT

pytestmark = [pytest.mark.torch, pytest.mark.slow]

DELAY = 0.05  # the straggler's sleep per forward; a step here computes for a few ms
JOBS = {2: 1, 4: 2}  # ranks -> the slow rank


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Trace folders by rank count: the 2-rank job writes gzipped traces, the 4-rank one plain."""
    out = {}
    for ranks, slow in JOBS.items():
        folder = tmp_path_factory.mktemp(f"profile{ranks}")
        gzip = ["--gzip"] if ranks == 2 else []
        args = [str(folder), "--slow-rank", str(slow), "--delay", str(DELAY), *gzip]
        command = forked(ranks, args, module="tests.traces.profiler_job")
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
        done = run_job_command(command, env, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        out[ranks] = folder
    return out


@pytest.mark.parametrize("ranks", sorted(JOBS))
def test_recorded_straggler_is_named_with_its_cause(recorded: dict[int, Path], ranks: int) -> None:
    suffix = ".pt.trace.json.gz" if ranks == 2 else ".pt.trace.json"
    assert len(list(recorded[ranks].glob(f"*{suffix}"))) == ranks
    summary, result, _ = offline.analyze_file(recorded[ranks])
    assert summary["world_size"] == ranks
    assert summary["data_quality"]["files_rejected"] == 0
    assert summary["steps_seen"] >= 6
    named = summary["stragglers"]
    assert [s["rank"] for s in named] == [JOBS[ranks]], named
    assert named[0]["cause"] == "slow_worker"
    assert named[0]["evidence"]["op_type"] == "forward-compute"
    # Every step waits for the sleeper: at least its delay per step is lost against the ideal.
    assert summary["slowdown"] >= 1.0 + 0.5 * DELAY / result.ideal_step_time, summary["slowdown"]
