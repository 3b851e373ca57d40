"""A small GPT trained with DDP in the usual loop, with SMon's one line and knobs that make it straggle.

Run under torchrun (gloo backend, CPU):
    torchrun --nproc-per-node 4 -m smon_server.demo.loop_train --steps 200 --device-ms 30 \\
        --accum 2 --eval-every 50 --log-every 10 --slow-rank 1 --delay 0.02

The training loop is what a DDP script usually looks like: a DistributedSampler, gradient
accumulation under `model.no_sync()`, a loss line every few steps, periodic evaluation and
checkpoints on rank 0. `smon.attach(...)` is the only SMon line; `mon.phase("checkpoint")` names the
checkpoint so SMon can tell it from other host work.

Model size. With `--device-ms D > 0` each forward also spends D ms of simulated device time (backward
2D; see demo/device.py: several ranks sharing 2 cores would otherwise straggle by turns) and the
model is tiny, so real arithmetic stays a small part of a step. With `--device-ms 0` there is no
simulated time and the model is larger: about 20-50 ms of real CPU arithmetic per step and rank
at one thread. `--d-model/--layers/--seq-len/--batch-size` override either default.

Knobs, each off by default (rank -1 = no rank):
    --slow-rank R --delay S            rank R's forward takes S s longer (a slow GPU)
    --slow-from N                      ... only from optimizer step N on (a straggler's onset; the
                                       report records its wall time as "onset")
    --host-rank R --host-delay S       rank R sleeps S s before each micro-step's forward, outside
                                       every phase SMon times (untimed host work)
    --slow-data-rank R --data-delay S  rank R's dataset takes S s per batch (__getitem__; with
                                       --workers the workers' prefetching hides part of it)
    --gc-rank R --gc-every N           rank R builds garbage and runs gc.collect() every N steps,
                                       between backward and optimizer.step(): the other ranks feel
                                       it at the next step's all-reduce
    --eval-every N --eval-batches B    rank 0 alone evaluates B batches after every N-th step,
                                       through the DDP module (SMon sees `eval` forwards); the
                                       other ranks go on and wait at the next all-reduce
    --log-every N                      rank 0 logs the loss (loss.item()) every N steps
    --ckpt-every N                     rank 0 saves model + optimizer state every N steps (DDP
                                       replicas are identical, so one copy is the usual idiom),
                                       inside `with mon.phase("checkpoint")`
    --workers W                        DataLoader worker processes
    --report DIR                       each rank writes its wall time per optimizer step to
                                       DIR/rank{r}.json as {"step_times": [...]}
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import smon
from smon_server.demo.device import SimulatedDevice

log = logging.getLogger("loop_train")

# Model size when a step's time is simulated device time (tiny) or real arithmetic (small).
TINY = {"d_model": 32, "layers": 1, "seq_len": 16, "batch_size": 8}
SMALL = {"d_model": 128, "layers": 2, "seq_len": 48, "batch_size": 8}
VOCAB = 64


# --- data -------------------------------------------------------------------------------------


class ArithmeticSequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Token sequences x_t = (a + b·t) mod VOCAB, a and b drawn per item: learnable next-token
    prediction (the model must read b from the context). `delay` seconds per item mimic slow
    decoding / augmentation / storage."""

    def __init__(self, size: int, seq_len: int, seed: int = 0, delay: float = 0.0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.start = torch.randint(0, VOCAB, (size,), generator=generator)
        self.stride = torch.randint(1, 8, (size,), generator=generator)
        self.positions = torch.arange(seq_len + 1)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        tokens = (self.start[index] + self.stride[index] * self.positions) % VOCAB
        return tokens[:-1], tokens[1:]


# --- model ------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, pre-norm transformer blocks, a language-model head. The
    `device` layer stands for the accelerator's kernel time (and a slow GPU's surplus)."""

    def __init__(self, d_model: int, layers: int, seq_len: int, device: nn.Module) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, d_model)
        self.positions = nn.Embedding(seq_len, d_model)
        self.device = device
        self.blocks = nn.ModuleList(Block(d_model, heads=4) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.device(self.tokens(idx) + self.positions(positions))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln(x))
        return logits


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- the knobs that are not a layer or a dataset ----------------------------------------------


def make_garbage(objects: int = 10_000) -> None:
    """Reference cycles that only the cycle collector frees. The pause of the `gc.collect()` that
    follows is mostly the walk over every live container object: a DDP process holds a few hundred
    thousand of them (torch alone ~170k), 0.1-0.4 s per full collection on a small shared CPU."""
    nodes: list[dict[str, object]] = [{"id": i} for i in range(objects)]
    for node, following in zip(nodes, nodes[1:] + nodes[:1], strict=True):
        node["next"] = following


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader[tuple[torch.Tensor, torch.Tensor]], batches: int) -> float:
    model.eval()
    losses = []
    for i, (x, y) in enumerate(loader):
        if i >= batches:
            break
        losses.append(lm_loss(model(x), y).item())
    model.train()
    return sum(losses) / max(1, len(losses))


def save_checkpoint(model: DistributedDataParallel, optimizer: torch.optim.Optimizer, path: Path) -> None:
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(state, path)


# --- the script -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--d-model", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch-size", type=int, help="per rank and micro-step")
    p.add_argument("--device-ms", type=float, default=0.0, help="simulated device ms per forward")
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    # Straggler knobs.
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--delay", type=float, default=0.0, help="extra seconds per forward on --slow-rank")
    p.add_argument("--slow-from", type=int, default=0, help="the slow rank is slow from this step on")
    p.add_argument("--host-rank", type=int, default=-1)
    p.add_argument("--host-delay", type=float, default=0.0, help="untimed seconds per micro-step")
    p.add_argument("--slow-data-rank", type=int, default=-1)
    p.add_argument("--data-delay", type=float, default=0.0, help="extra seconds per batch")
    p.add_argument("--gc-rank", type=int, default=-1)
    p.add_argument("--gc-every", type=int, default=0)
    # Ordinary periodic work.
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-batches", type=int, default=10)
    p.add_argument("--log-every", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--report", type=Path, help="write this rank's own step times (JSON) here")
    args = p.parse_args(argv)
    for key, value in (TINY if args.device_ms > 0 else SMALL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s")
    torch.manual_seed(0)
    torch.set_num_threads(1)

    device_s = args.device_ms / 1000
    extra_s = args.delay if rank == args.slow_rank else 0.0
    device = SimulatedDevice(device_s, extra=extra_s) if device_s or extra_s else nn.Identity()
    if extra_s and args.slow_from and isinstance(device, SimulatedDevice):
        device.extra = 0.0  # healthy until the onset
    onset: float | None = None
    model = DistributedDataParallel(GPT(args.d_model, args.layers, args.seq_len, device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    item_delay = args.data_delay / args.batch_size if rank == args.slow_data_rank else 0.0
    samples = args.steps * args.accum * args.batch_size * world_size
    dataset = ArithmeticSequences(samples, args.seq_len, delay=item_delay)
    sampler: DistributedSampler[int] = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    eval_loader = DataLoader(ArithmeticSequences(256, args.seq_len, seed=1), batch_size=args.batch_size)

    mon = smon.attach(model=model, optimizer=optimizer, dataloader=loader)  # the one line

    checkpoint_dir = Path(tempfile.mkdtemp(prefix="loop_train_ckpt_")) if args.ckpt_every else None
    step_times: list[float] = []
    step = epoch = 0
    tick = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        epoch += 1
        for micro, (x, y) in enumerate(loader):
            if rank == args.host_rank and args.host_delay:
                time.sleep(args.host_delay)  # untimed host work: no phase SMon times is open here
            last_micro = (micro + 1) % args.accum == 0
            with contextlib.nullcontext() if last_micro else model.no_sync():
                loss = lm_loss(model(x), y) / args.accum
                loss.backward()
            if not last_micro:
                continue
            if rank == args.gc_rank and args.gc_every and step % args.gc_every == 0:
                make_garbage()
                gc.collect()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            now = time.perf_counter()
            step_times.append(now - tick)
            tick = now
            step += 1
            if extra_s and args.slow_from and step == args.slow_from and isinstance(device, SimulatedDevice):
                device.extra = extra_s
                onset = time.time()

            # Periodic work after the optimizer step: SMon charges it to the next step.
            if rank == 0 and args.log_every and step % args.log_every == 0:
                log.info("step %d  loss %.4f", step, loss.item() * args.accum)
            if rank == 0 and args.eval_every and step % args.eval_every == 0:
                log.info("step %d  eval loss %.4f", step, evaluate(model, eval_loader, args.eval_batches))
            if rank == 0 and checkpoint_dir is not None and step % args.ckpt_every == 0:
                with mon.phase("checkpoint"):
                    save_checkpoint(model, optimizer, checkpoint_dir / f"step{step:06d}.pt")
            if step >= args.steps:
                break

    if args.report:
        args.report.mkdir(parents=True, exist_ok=True)
        (args.report / f"rank{rank}.json").write_text(json.dumps({"step_times": step_times, "onset": onset}))
    dist.barrier()
    dist.destroy_process_group()
    if checkpoint_dir is not None:
        for path in checkpoint_dir.glob("*.pt"):
            path.unlink()
        checkpoint_dir.rmdir()
    if rank == 0 and os.environ.get("SMON_DEMO_QUIET") != "1":
        print(f"training finished: {step} steps on {world_size} ranks", flush=True)


if __name__ == "__main__":
    main()
