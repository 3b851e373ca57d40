"""A pipeline-parallel × data-parallel training job (gloo, CPU) instrumented with SMon.

Run under torchrun with 4 processes: 2 pipeline stages × 2 data-parallel replicas, a GPipe schedule
over `--microbatches` micro-batches with torch point-to-point send / recv between the stages, and
a gradient all-reduce within each stage's data-parallel group:
    torchrun --nproc-per-node 4 -m smon_server.demo.pipeline_train --heavy-last-stage 3

The knobs model two causes SMon diagnoses: `--heavy-last-stage K` gives the last stage K times the
layers of the first (stage partitioning imbalance); `--seq-skew` feeds micro-batches of skewed
sequence lengths through attention-like compute that grows with length² (sequence imbalance).
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.distributed as dist
from torch import nn

import smon
from smon_server.demo.device import kernel_time


class Block(nn.Module):
    """A linear layer plus attention-like mixing, whose device time grows with sequence length²
    (`layer_s` at the base length; see demo/device.py for why the time is simulated)."""

    def __init__(self, hidden: int, layer_s: float, base_tokens: int, attention: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.layer_s = layer_s
        self.base_tokens = base_tokens
        self.attention = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cost = self.layer_s
        if self.attention:
            scores = torch.softmax(x @ x.transpose(0, 1) / x.shape[1] ** 0.5, dim=-1)
            x = x + scores @ x
            cost *= (x.shape[0] / self.base_tokens) ** 2
        # After the linear layer, so every block has a backward (stage 0's input needs no grad).
        return torch.relu(kernel_time(self.linear(x), cost))


def stage_model(layers: int, hidden: int, layer_s: float, tokens: int, attention: bool) -> nn.Module:
    return nn.Sequential(*(Block(hidden, layer_s, tokens, attention) for _ in range(layers)))


def sequence_length(args: argparse.Namespace, step: int, dp_rank: int, microbatch: int) -> int:
    """Both stages of one replica see the same lengths; replicas and steps differ at random.

    Long-tailed (log-normal) lengths, as in real corpora: a micro-batch that happens to hold long
    sequences costs far more attention time, and which replica gets one changes every step."""
    if not args.seq_skew:
        return args.tokens
    rng = random.Random(f"{step}/{dp_rank}/{microbatch}")
    return max(8, min(8 * args.tokens, round(args.tokens * rng.lognormvariate(0.0, 0.7))))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layer-ms", type=float, default=4.0, help="device time per layer, forward")
    p.add_argument("--tokens", type=int, default=64, help="tokens per micro-batch (base length)")
    p.add_argument("--layers", type=int, default=2, help="layers on the first stage")
    p.add_argument("--heavy-last-stage", type=int, default=1, help="last stage has K× the layers")
    p.add_argument("--seq-skew", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dp = world // args.pp
    stage, dp_rank = rank // dp, rank % dp
    last = stage == args.pp - 1
    torch.manual_seed(stage)
    torch.set_num_threads(1)

    groups = [dist.new_group([s * dp + d for d in range(dp)]) for s in range(args.pp)]
    dp_group = groups[stage]
    prev_rank = rank - dp if stage > 0 else None
    next_rank = rank + dp if not last else None

    layers = args.layers * (args.heavy_last_stage if last else 1)
    model = stage_model(layers, args.hidden, args.layer_ms / 1000, args.tokens, args.seq_skew)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    mon = smon.attach(model=model, optimizer=optimizer, dp_rank=dp_rank, pp_rank=stage, tp_rank=0)

    for step in range(args.steps):
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        for mb in range(args.microbatches):  # GPipe: all forwards, then all backwards
            length = sequence_length(args, step, dp_rank, mb)
            mon.record_batch(seq_lens=[length], microbatch=mb)
            if prev_rank is None:
                x = torch.randn(length, args.hidden)
            else:
                x = torch.empty(length, args.hidden)
                with mon.phase("forward_recv", microbatch=mb):
                    dist.recv(x, src=prev_rank)
                x.requires_grad_()
            y = model(x)
            if next_rank is not None:
                with mon.phase("forward_send", microbatch=mb):
                    dist.send(y.detach(), dst=next_rank)
            else:
                y = y.pow(2).mean()
            kept.append((x, y))
        for mb, (x, y) in enumerate(kept):
            if next_rank is None:
                y.backward()
            else:
                grad = torch.empty_like(y)
                with mon.phase("backward_recv", microbatch=mb):
                    dist.recv(grad, src=next_rank)
                y.backward(grad)
            if prev_rank is not None:
                assert x.grad is not None
                with mon.phase("backward_send", microbatch=mb):
                    dist.send(x.grad, dst=prev_rank)
        with mon.phase("grad_sync"):
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
            dist.all_reduce(flat, group=dp_group)
            flat /= dp
            offset = 0
            for p in model.parameters():
                if p.grad is not None:
                    n = p.grad.numel()
                    p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                    offset += n
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
