"""A real DDP job (gloo, CPU) recorded with torch.profiler, one Chrome trace per rank.

Run under torchrun: `profiler_job.py OUTDIR [--slow-rank R --delay S] [--gzip]`. The slow rank
sleeps `delay` seconds inside its forward (a forward pre-hook of the inner module), the injected
straggler the offline analysis must name. Each rank also writes its own step wall times
(`truth/rank<r>.json`, beside the traces) so a test can compare the analysis with what the job
measured.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

# 24 recorded steps: with 8, one rank's all-reduce delayed by the 2-core machine on 2 of 7 steps
# (2 ms on an 8 ms step) read as a second straggler; over 20+ steps the analysis's window test
# (robust.beyond_noise: blocks of 5 steps) tells such a burst from a rank slow throughout.
WAIT, WARMUP, ACTIVE = 1, 1, 24


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--gzip", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    if rank == args.slow_rank:
        inner.register_forward_pre_hook(lambda _m, _a: time.sleep(args.delay))
    model = nn.parallel.DistributedDataParallel(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(32, 64), torch.randn(32, 8)) for _ in range(4)]
    loader: Any = torch.utils.data.DataLoader(data, batch_size=None)  # type: ignore[arg-type]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"rank{rank}.pt.trace.json"
    times: list[float] = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        step = 0
        while step < WAIT + WARMUP + ACTIVE:
            for x, y in loader:
                t = time.perf_counter()
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t)
                prof.step()
                step += 1
                if step == WAIT + WARMUP + ACTIVE:
                    break
    if args.gzip:
        with path.open("rb") as raw, gzip.open(f"{path}.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        path.unlink()
    truth = args.out / "truth"
    truth.mkdir(exist_ok=True)
    (truth / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "step_seconds": times}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
