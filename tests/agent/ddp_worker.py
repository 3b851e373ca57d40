"""One rank of the 2-process gloo DDP job in test_ddp.py (a module of its own so spawn can import it)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.agent.torch_models import mlp

STEPS = 4
SLOW_RANK = 1
BACKWARD_SLEEP = 0.03


def _model(rank: int) -> torch.nn.Module:
    # The slow rank's backward sleeps before its last bucket is ready, so the other rank's last
    # all-reduce has to wait for it: exposed grad_sync on the fast rank.
    return mlp(backward_sleep=BACKWARD_SLEEP if rank == SLOW_RANK else 0.0)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> list[float]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run(rank: int, world_size: int, port: int, server: str, out_dir: str) -> None:
    import smon

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    capture = _Capture()
    logging.getLogger("smon").addHandler(capture)
    logging.getLogger("smon").setLevel(logging.INFO)
    fast: dict[str, Any] = dict(server=server, flush_interval=0.05, nvml_interval=0, flush_timeout=5)
    result: dict[str, Any] = {}

    def ddp_model() -> DDP:
        return DDP(_model(rank), bucket_cap_mb=0.001)  # ~1 KB buckets: several per step

    # A: no agent. B: the same run with the agent attached.
    ddp = ddp_model()
    result["plain"] = _train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05), rank)
    ddp = ddp_model()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)

    def train_with(model: DDP, opt: torch.optim.Optimizer) -> list[float]:
        return _train(model, opt, rank)

    mon = smon.attach(ddp, optimizer, job="ddp-agent", **fast)
    result["agent"] = train_with(ddp, optimizer)
    mon.close()
    result["agent_errors"] = mon.counters()["errors"]
    # Attaching again to the same DDP model re-arms the comm hook the first monitor left behind.
    mon = smon.attach(ddp, optimizer, job="ddp-reattach", **fast)
    train_with(ddp, optimizer)
    mon.close()

    # C: the user registered a comm hook before attach: SMon leaves it alone (it registers none of its
    # own) and still measures grad_sync, which now includes the user's hook.
    calls = {"pre": 0, "post": 0}

    def counting_hook(name: str) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # unannotated: DDP inspects hook annotations
            calls[name] += 1
            return default_hooks.allreduce_hook(state, bucket)

        return hook

    ddp = ddp_model()
    ddp.register_comm_hook(None, counting_hook("pre"))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    mon = smon.attach(ddp, optimizer, job="ddp-user-hook-before", **fast)
    result["pre_losses"] = train_with(ddp, optimizer)
    mon.close()
    result["pre_hooks"] = len(ddp._comm_hooks)  # DDP's record of registered hooks: the user's only

    # D: the user registers a comm hook after attach: their call succeeds (SMon holds no comm hook
    # that would make DDP refuse it), their hook runs, and grad_sync is measured around it.
    ddp = ddp_model()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    mon = smon.attach(ddp, optimizer, job="ddp-user-hook-after", **fast)
    ddp.register_comm_hook(None, counting_hook("post"))
    result["post_losses"] = train_with(ddp, optimizer)
    mon.close()

    # E: gradient accumulation, the first micro-batch under no_sync(): DDP all-reduces only in the
    # second backward, so only that one has a grad_sync.
    ddp = ddp_model()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    mon = smon.attach(ddp, optimizer, job="ddp-no-sync", **fast)
    generator = torch.Generator().manual_seed(200 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 1, generator=generator)
        with ddp.no_sync():
            torch.nn.functional.mse_loss(ddp(x[:4]), y[:4]).backward()
        torch.nn.functional.mse_loss(ddp(x[4:]), y[4:]).backward()
        optimizer.step()
        optimizer.zero_grad()
    mon.close()
    result["no_sync_errors"] = mon.counters()["errors"]

    # F: attached to the plain module, which is then wrapped in DDP: DDP's forward calls the timed
    # module (forward and backward spans; grad_sync needs the DDP object as the root).
    inner = _model(rank)
    optimizer = torch.optim.SGD(inner.parameters(), lr=0.05)
    mon = smon.attach(inner, optimizer, job="ddp-inner", **fast)
    ddp = DDP(inner, bucket_cap_mb=0.001)
    result["inner_losses"] = train_with(ddp, optimizer)
    mon.close()
    restored = type(ddp.module) is torch.nn.Sequential
    result["inner_class"] = type(ddp.module).__name__ + ("" if restored else " (still timed)")

    result["calls"] = calls
    result["log"] = capture.messages
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
