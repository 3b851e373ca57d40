"""Hugging Face Accelerate loop under torchrun (gloo, CPU) with
`smon.integrations.accelerate.attach(accelerator)`.

`accelerate_job.py OUT PREFIX --slow-rank R --delay S`: runs `PREFIX-healthy`, `PREFIX-slow` and
`PREFIX-plain` (see jobs.py). Accelerate keeps its trackers (and their run name) on the main
process only, so the run's name is passed to attach as `job=` (SMON_JOB unset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from torch.utils.data import DataLoader

import smon.integrations.accelerate as smon_accelerate
from tests.integrations.jobs import Tokens, checksum, main, slow_down, tiny_gpt2

STEPS, ACCUMULATE, EVERY = 16, 2, 8


class MemoryTracker(GeneralTracker):
    """An experiment tracker that keeps what it is sent (as Accelerate's own trackers do, it is
    constructed with the run's name)."""

    name = "memory"
    requires_logging_directory = False

    def __init__(self, run_name: str) -> None:
        super().__init__()
        self.run_name = run_name
        self.logged: list[dict[str, Any]] = []

    @property
    def tracker(self) -> Any:
        return self.logged

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.logged.append({"step": step, **values})


def run(out: Path, name: str, monitored: bool, slow_rank: int, delay: float) -> dict[str, Any]:
    torch.manual_seed(0)
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=ACCUMULATE, log_with=[MemoryTracker(name)]
    )
    accelerator.init_trackers(name)
    model = tiny_gpt2()
    slow_down(model, delay if accelerator.process_index == slow_rank else 0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = DataLoader(Tokens(), batch_size=4)
    held_out = DataLoader(Tokens(16, seed=1), batch_size=8)
    model, optimizer, train, held_out = accelerator.prepare(model, optimizer, train, held_out)
    monitor = smon_accelerate.attach(accelerator, model, dataloader=train, job=name, enable=monitored)
    losses: list[float] = []
    step = 0
    for batch in train:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            continue
        step += 1
        losses.append(float(loss.detach()))
        accelerator.log({"loss": losses[-1]}, step=step)
        if step % EVERY == 0:
            model.eval()
            with torch.no_grad():
                for held in held_out:
                    model(**held)
            model.train()
            accelerator.save_state(str(out / name / f"step-{step}"))
        if step == STEPS:
            break
    # accelerator.end_training() would close the monitor too, but it also destroys the process
    # group, which the next run in this process needs.
    monitor.close()
    return {"losses": losses, "params": checksum(accelerator.unwrap_model(model))}


def runs(out: Path, prefix: str, slow_rank: int, delay: float) -> dict[str, dict[str, Any]]:
    return {
        "healthy": run(out, f"{prefix}-healthy", True, -1, 0.0),
        "slow": run(out, f"{prefix}-slow", True, slow_rank, delay),
        "plain": run(out, f"{prefix}-plain", False, -1, 0.0),
    }


if __name__ == "__main__":
    main(runs)
