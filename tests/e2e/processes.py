"""Running a training job from a test: its own process group, killed whole on a timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import pytest


def run_job_command(
    command: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Like subprocess.run, but a timeout kills torchrun *and* its ranks (no orphan keeps loading
    the machine for the next test) and fails with the end of the job's stderr, so a hang says
    where it stood."""
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
