"""A DDP job (gloo, CPU) with a simulated GPU beside each rank (smon.testing.SimulatedCuda).

Each rank's host takes real time to issue its phases (sleeps: the host's own work, as a
launch-bound model or a CPU collective spends it) and queues kernels on its device, which runs
them in real time on its own; the agent times phases with CUDA events on that device, as on a GPU.
`--spin-rank` queues an extra kernel at the start of that rank's forward (issue 29: a 7.4 ms spin
kernel on an H200). Whether it costs anything depends on the host's slack: the gradient
all-reduce waits for the device's gradients (a comm hook, as gloo on CUDA tensors copies them
first) and the step ends with `wait()` (a `loss.item()`), so a kernel that outlasts the host's
issue time delays the step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import smon
from smon.cuda_timing import CudaClock
from smon.sampling import DeviceSampling
from smon.testing import SimulatedCuda


class _Phase(torch.autograd.Function):
    """Forward and backward each: queue device kernels, then spend the host's issue time."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: IssuedLayer) -> torch.Tensor:
        ctx.layer = layer
        layer.device.launch(layer.spin_ms + layer.forward_device_ms)
        time.sleep(layer.forward_host_ms / 1000)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        layer = ctx.layer
        layer.device.launch(layer.backward_device_ms)
        time.sleep(layer.backward_host_ms / 1000)
        return grad, None


class IssuedLayer(nn.Module):
    def __init__(self, device: SimulatedCuda, spin_ms: float) -> None:
        super().__init__()
        self.device, self.spin_ms = device, spin_ms
        self.forward_host_ms, self.forward_device_ms = 12.0, 3.0
        self.backward_host_ms, self.backward_device_ms = 20.0, 6.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _Phase.apply(x, self)
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--spin-rank", type=int, default=-1)
    p.add_argument("--spin-ms", type=float, default=0.0)
    p.add_argument("--report", type=Path)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = SimulatedCuda()
    spin = args.spin_ms if rank == args.spin_rank else 0.0
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 32), IssuedLayer(device, spin)))

    # (unannotated: DDP checks the annotations, which this module's future import turns into strings)
    def gradients_from_the_device(state, bucket):
        device.wait()
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(None, gradients_from_the_device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    smon.attach(model=model, optimizer=optimizer, timing=CudaClock(device, sampling=DeviceSampling(1)))
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    step_times: list[float] = []
    tick = time.perf_counter()
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        device.wait()  # the step's `loss.item()`
        now = time.perf_counter()
        step_times.append(now - tick)
        tick = now
    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / f"rank{rank}.json").write_text(json.dumps({"step_times": step_times}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
