"""A training process that forks DataLoader workers keeps working with the agent attached.

gRPC's fork handlers crash forked children of a process that holds gRPC threads
(grpc/grpc#32758; before the shipper moved to its own process this crashed a DataLoader worker
in about one run in four here). The job runs as its own process, as in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

EPOCHS = 10
ROOT = Path(__file__).resolve().parents[2]


def test_dataloader_workers_and_bare_forks_survive(ingest):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.agent.fork_job", ingest.address, str(EPOCHS)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["bare_fork_child_exit"] == 0
    assert summary["grpc_loaded"] is False  # the training process never loaded gRPC
    assert summary["batches"] == 2 * EPOCHS * 4
    assert "Segmentation" not in done.stderr and "Check failed" not in done.stderr

    by_job: dict[str, set[int]] = {}
    waits: dict[str, int] = {}
    for batch in ingest.servicer.snapshot():
        by_job.setdefault(batch.coords.job, set()).update(s.step for s in batch.steps)
        waits[batch.coords.job] = waits.get(batch.coords.job, 0) + sum(
            1 for s in batch.steps for span in s.spans if span.kind == "data_wait"
        )
    assert by_job["fork-a"] == set(range(EPOCHS * 4)) == by_job["fork-b"]
    assert waits["fork-a"] == EPOCHS * 4 and waits["fork-b"] == EPOCHS * 4
    assert by_job["fork-persistent"] == set(range(3 * 4 + 1))  # the bare fork's child added nothing
    assert waits["fork-persistent"] == 3 * 4
