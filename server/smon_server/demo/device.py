"""Simulated accelerator time for the demo and test jobs, which run on a small CPU.

With 4 ranks sharing 2 cores, real arithmetic would make every rank a straggler by turns (the OS
time-slices them) and drown the effect being demonstrated. A GPU kernel is wall time during which
the host CPU is free; sleeping reproduces exactly that, in forward and (twice as long) in backward.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn


class _KernelTime(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
        ctx.backward_s = backward_s
        time.sleep(forward_s)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        time.sleep(ctx.backward_s)
        return grad, None, None


def kernel_time(x: torch.Tensor, forward_s: float, backward_s: float | None = None) -> torch.Tensor:
    """Pass `x` through, spending `forward_s` now and `backward_s` (default 2×) in backward."""
    backward = 2 * forward_s if backward_s is None else backward_s
    out: torch.Tensor = _KernelTime.apply(x, forward_s, backward)
    return out


class SimulatedDevice(nn.Module):
    """A layer that costs `forward_s` (+ `extra`, a slow GPU's surplus) of device time."""

    def __init__(self, forward_s: float, extra: float = 0.0) -> None:
        super().__init__()
        self.forward_s = forward_s
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernel_time(x, self.forward_s + self.extra, 2 * self.forward_s)
