"""Small CPU models with known costs, so spans can be checked against injected sleeps."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn


class SleepyForward(nn.Module):
    """Sleeps `seconds` in every forward call."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class SleepyBackward(nn.Module):
    """Identity whose backward sleeps `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SleepInBackward.apply(x, self.seconds)


def mlp(width: int = 16, *, forward_sleep: float = 0.0, backward_sleep: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(width, width), nn.ReLU()]
    if forward_sleep:
        layers.append(SleepyForward(forward_sleep))
    if backward_sleep:
        layers.append(SleepyBackward(backward_sleep))
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


class SlowDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Deterministic samples; each costs `seconds` to load."""

    def __init__(self, n: int = 32, width: int = 16, seconds: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, width, generator=generator)
        self.y = torch.randn(n, 1, generator=generator)
        self.seconds = seconds

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.seconds:
            time.sleep(self.seconds)
        return self.x[i], self.y[i]


def train(
    model: nn.Module, optimizer: torch.optim.Optimizer, loader: Any, *, accumulate: int = 1
) -> list[float]:
    """A plain training loop, exactly as a user writes it; returns the losses."""
    losses = []
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        (loss / accumulate).backward()
        losses.append(loss.item())
        if (i + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    return losses
