"""A training process that forks: DataLoader workers (fork start method) and a bare os.fork().

Run by test_fork_safety.py as its own process, so that nothing in it has loaded gRPC except what
the agent loads (nothing: the agent ships from its sidecar process). Prints a JSON summary.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
from torch.utils.data import DataLoader

import smon
from tests.agent.torch_models import SlowDataset


def main(server: str, epochs: int) -> None:
    torch.multiprocessing.set_start_method("fork", force=True)
    summary: dict[str, object] = {}
    loader = DataLoader(SlowDataset(n=8, seconds=0.002), batch_size=2, num_workers=2)
    persistent = DataLoader(SlowDataset(n=8), batch_size=2, num_workers=2, persistent_workers=True)
    batches = 0
    for job in ("fork-a", "fork-b"):  # attach, close and attach again on the same loaders
        mon: Any = smon.attach(
            dataloader=loader,
            server=server,
            job=job,
            nvml_interval=0,
            flush_interval=0.02,
            heartbeat_interval=0.05,
        )
        for _ in range(epochs):  # every epoch forks two fresh workers
            for _batch in loader:
                batches += 1
                mon.step()
        mon.close()
    mon = smon.attach(
        dataloader=persistent, server=server, job="fork-persistent", nvml_interval=0, flush_interval=0.02
    )
    for _ in range(3):
        for _batch in persistent:
            mon.step()
    # A bare fork, like any library may do: the child's monitor is off and records nothing.
    pid = os.fork()
    if pid == 0:
        ok = not mon.tracker.active
        mon.step()
        mon.close()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    summary["bare_fork_child_exit"] = os.waitstatus_to_exitcode(status)
    mon.step()
    mon.close()
    summary["batches"] = batches
    summary["grpc_loaded"] = "grpc" in sys.modules
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
