"""Running a training job from a test: its own process group, killed whole on a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import pytest

from tests.support.warm_launcher import FORKRUN, JobTimeout, warm_launcher

# Tests about torchrun itself (elastic restarts), the demo users run and the framework
# integrations launch with torchrun; the rest fork their ranks from a launcher that imported torch
# once for the whole test session, ~11 s less per 4-rank job than torchrun on this 2-core machine
# (tests/support/forkrun.py).


def forked(ranks: int, args: Sequence[str], module: str = "smon_server.demo.train") -> list[str]:
    """`training_command`'s job, its ranks forked by tests.support.forkrun (torchrun's rank
    environment). run_job_command runs it on the session's warm launcher; the command alone runs
    the same job from a shell."""
    return [*FORKRUN, f"--nproc-per-node={ranks}", "-m", module, *args]


def run_job_command(
    command: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Like subprocess.run, but a timeout kills torchrun *and* its ranks (no orphan keeps loading
    the machine for the next test) and fails with the end of the job's stderr, so a hang says
    where it stood. A forkrun command runs on the warm launcher."""
    if list(command[: len(FORKRUN)]) == FORKRUN:
        try:
            status, stdout, stderr = warm_launcher().run(command[len(FORKRUN) :], env, timeout)
        except JobTimeout as timed_out:
            pytest.fail(
                f"job still running after {timeout:.0f} s; its stderr ends:\n{timed_out.stderr[-4000:]}"
            )
        return subprocess.CompletedProcess(list(command), status, stdout, stderr)
    with subprocess.Popen(
        list(command),
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"job still running after {timeout:.0f} s; its stderr ends:\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
