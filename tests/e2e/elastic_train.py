"""A DDP job that torchrun restarts once (`--max-restarts 1`): in its first run one rank is slow and
another exits with an error at `--fail-at`; the restarted workers (TORCHELASTIC_RESTART_COUNT=1)
resume from the checkpoint step `--resume-at`, with no slow rank. Run by tests/e2e/test_restarts.py."""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import smon
from smon_server.demo.train import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=40, help="steps of the restarted run")
    p.add_argument("--fail-at", type=int, default=30)
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--resume-at", type=int, default=25)
    p.add_argument("--slow-rank", type=int, default=2)
    p.add_argument("--delay", type=float, default=0.04, help="extra seconds per forward, first run")
    p.add_argument("--device-ms", type=float, default=40.0)
    args = p.parse_args()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    first_run = restart == 0
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun (torch 2.13) hands the restarted workers the same agent store (MASTER_PORT), where
    # the dead workers' gloo addresses are still written: each restart gets its own key prefix.
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False
    )
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"restart-{restart}", store), rank=rank, world_size=world_size
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    delay = args.delay if first_run and rank == args.slow_rank else 0.0
    model = DistributedDataParallel(build_model(64, 256, args.device_ms / 1000, delay))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = 0 if first_run else args.resume_at
    smon.attach(model=model, optimizer=optimizer, start_step=start)

    x = torch.randn(32, 64)
    y = x.sum(dim=1, keepdim=True)
    for step in range(start, args.fail_at + 1 if first_run else args.resume_at + args.steps):
        if first_run and step == args.fail_at and rank == args.fail_rank:
            print(f"rank {rank}: failing at step {step}", file=sys.stderr, flush=True)
            sys.exit(1)  # the others wait in this step's all-reduce until torchrun stops them
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
