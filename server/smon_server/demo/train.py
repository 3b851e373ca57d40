"""An ordinary DDP training script with SMon's one line, and knobs to inject a straggler.

Run under torchrun (gloo backend, CPU):
    torchrun --nproc-per-node 4 -m smon_server.demo.train --steps 300 --slow-rank 2 --delay 0.03

The knobs model the causes SMon diagnoses: `--slow-rank/--delay` (a slow worker: extra time in
forward), `--slow-data-rank/--data-delay` (a slow data loader), `--gc-rank` (Python GC pauses).
Everything except the `smon.attach` line is what a training script already has.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import smon
from smon_server.demo.device import SimulatedDevice


class SyntheticDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int, features: int, delay: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, features, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.x[index], self.y[index]


def build_model(features: int, hidden: int, device_s: float, delay: float) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        SimulatedDevice(device_s, extra=delay),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 1),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--device-ms", type=float, default=20.0, help="simulated forward kernel time")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--delay", type=float, default=0.0, help="extra seconds per forward")
    p.add_argument("--slow-data-rank", type=int, default=-1)
    p.add_argument("--data-delay", type=float, default=0.0, help="extra seconds per batch")
    p.add_argument("--gc-rank", type=int, default=-1, help="rank that runs a full GC often")
    p.add_argument("--gc-every", type=int, default=5)
    p.add_argument("--report", type=Path, help="write this rank's own step times (JSON) here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    model = DistributedDataParallel(
        build_model(
            args.features,
            args.hidden,
            args.device_ms / 1000,
            args.delay if rank == args.slow_rank else 0.0,
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    per_item = args.data_delay / args.batch_size if rank == args.slow_data_rank else 0.0
    loader = DataLoader(
        SyntheticDataset(args.steps * args.batch_size, args.features, per_item),
        batch_size=args.batch_size,
    )

    smon.attach(model=model, optimizer=optimizer, dataloader=loader)  # the one line

    garbage: list[object] = []
    step_times: list[float] = []
    tick = time.perf_counter()
    for step, (x, y) in enumerate(loader):
        if step >= args.steps:
            break
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        if rank == args.gc_rank and step % args.gc_every == 0:
            garbage = [[{"i": i} for i in range(2000)] for _ in range(20)]
            gc.collect()
        optimizer.step()
        now = time.perf_counter()
        step_times.append(now - tick)
        tick = now
    del garbage
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / f"rank{rank}.json").write_text(json.dumps({"step_times": step_times}))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and os.environ.get("SMON_DEMO_QUIET") != "1":
        print(f"training finished: {args.steps} steps on {world_size} ranks", flush=True)


if __name__ == "__main__":
    main()
