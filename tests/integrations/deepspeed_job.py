"""DeepSpeed (ZeRO stage 1, gloo, CPU) under torchrun with `smon.integrations.deepspeed.attach`.

`deepspeed_job.py OUT PREFIX --slow-rank R --delay S`: runs `PREFIX-healthy`, `PREFIX-slow` and
`PREFIX-plain` (see jobs.py). Each run's csv_monitor is configured with the run's name as its
`job_name`, which names the job on the server (SMON_JOB unset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deepspeed
import deepspeed.comm.torch
import torch
from torch.utils.data import DataLoader

import smon.integrations.deepspeed as smon_deepspeed
from tests.integrations.jobs import Tokens, checksum, main, slow_down, tiny_gpt2

STEPS, ACCUMULATE, EVERY = 16, 2, 8

# DeepSpeed's CPU accelerator compiles a shared-memory all-reduce (a C++ build of minutes) the
# first time a process group starts; plain gloo collectives do the same job for a test.
deepspeed.comm.torch.build_shm_op = lambda: None


def run(out: Path, name: str, monitored: bool, slow_rank: int, delay: float) -> dict[str, Any]:
    torch.manual_seed(0)
    model = tiny_gpt2()
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": ACCUMULATE,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "csv_monitor": {"enabled": True, "output_path": str(out / "csv"), "job_name": name},
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    slow_down(engine.module, delay if engine.global_rank == slow_rank else 0.0)
    monitor = smon_deepspeed.attach(engine, enable=monitored)
    train = DataLoader(Tokens(), batch_size=4)
    held_out = DataLoader(Tokens(16, seed=1), batch_size=8)
    losses: list[float] = []
    for micro, batch in enumerate(train):
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        if (micro + 1) % ACCUMULATE:
            continue
        losses.append(float(loss.detach()))
        step = engine.global_steps
        if step % EVERY == 0:
            engine.eval()
            with torch.no_grad():
                for held in held_out:
                    engine(**held)
            engine.train()
            engine.save_checkpoint(str(out / name), tag=f"step-{step}")
        if step == STEPS:
            break
    monitor.close()
    return {"losses": losses, "params": checksum(engine.module)}


def init_process_group() -> None:
    """DeepSpeed's own start of the process group (it keeps one that is already started)."""
    deepspeed.init_distributed(dist_backend="gloo")


def runs(out: Path, prefix: str, slow_rank: int, delay: float) -> dict[str, dict[str, Any]]:
    return {
        "healthy": run(out, f"{prefix}-healthy", True, -1, 0.0),
        "slow": run(out, f"{prefix}-slow", True, slow_rank, delay),
        "plain": run(out, f"{prefix}-plain", False, -1, 0.0),
    }


if __name__ == "__main__":
    main(runs, init_process_group)
