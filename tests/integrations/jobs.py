"""What the framework jobs share: a tiny causal LM built offline, token data, the injected
straggler, and the report a job writes for its test.

Each framework's job (run under torchrun, gloo, CPU) trains three times in one process group:
`healthy` (SMon on), `slow` (SMon on, one rank sleeping in every training forward) and `plain`
(SMon off, the healthy run's seed): the test compares `healthy` with `plain` to show SMon leaves
training results unchanged, and reads the server's analysis of the two monitored runs.

Every rank also sleeps `DEVICE_SECONDS` in every training forward, as a GPU's compute would take
time without taking a core: a tiny model's step is a few ms of CPU, and 2 ranks scheduled on 2
shared cores would otherwise be mostly scheduling noise (as in tests/e2e).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

VOCAB, SEQ, SAMPLES = 64, 16, 256
DEVICE_SECONDS = 0.03


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences: the same on every rank and every run."""

    def __init__(self, count: int = SAMPLES, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (count, SEQ), generator=generator)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2(seed: int = 0) -> nn.Module:
    """A 2-layer GPT-2 from a config transformers builds offline (no hub download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ)
    return GPT2LMHeadModel(config)


def slow_down(module: nn.Module, delay: float) -> None:
    """Simulated device time, and the straggler's `delay` on top: sleep before every training
    forward of `module`."""

    def sleep(mod: nn.Module, _args: Any) -> None:
        if mod.training and torch.is_grad_enabled():
            time.sleep(DEVICE_SECONDS + delay)

    module.register_forward_pre_hook(sleep)


def warm_shipper() -> None:
    """Load SMon's shipper process's imports once before the first run. The server decides a new
    agent's attempt by whether the job's other agents are still live, so on a loaded machine a run
    of a few seconds whose first shipper is slow to start (a cold grpc import) can find the other
    rank already finished and open a second attempt (reported with the branch)."""
    subprocess.run([sys.executable, "-c", "import grpc, smon.sidecar"], check=False)


def checksum(model: nn.Module) -> list[float]:
    return [float(p.detach().double().sum()) for p in model.parameters()]


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_report(out: Path, runs: dict[str, Any]) -> None:
    if rank() == 0:
        (out / "report.json").write_text(json.dumps(runs))


Runs = Callable[[Path, str, int, float], dict[str, dict[str, Any]]]


def main(runs: Runs, start: Callable[[], None] | None = None) -> None:
    """A job's command line: `JOB.py OUT PREFIX [--slow-rank R] [--delay S]`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("prefix")
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.05)
    a = parser.parse_args()
    if start is not None:
        start()
    warm_shipper()
    write_report(a.out, runs(a.out, a.prefix, a.slow_rank, a.delay))
