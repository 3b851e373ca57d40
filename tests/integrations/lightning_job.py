"""Lightning's DDP strategy on CPU (gloo) under torchrun with `callbacks=[SMonCallback()]`.

`lightning_job.py OUT PREFIX --slow-rank R --delay S`: runs `PREFIX-healthy`, `PREFIX-slow` and
`PREFIX-plain` (see jobs.py). Each run logs with `CSVLogger(name=PREFIX, version=RUN)`, which
names the job `PREFIX-RUN` on the server (SMON_JOB unset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from smon.integrations.lightning import SMonCallback
from tests.integrations.jobs import Tokens, checksum, main, slow_down, tiny_gpt2

STEPS, ACCUMULATE, EVERY = 16, 2, 8


class TinyLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_gpt2()
        self.losses: list[float] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.net(**batch).loss
        self.log("loss", loss)
        self.losses.append(float(loss.detach()))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.net(**batch).loss, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def run(
    out: Path, prefix: str, version: str, monitored: bool, slow_rank: int, delay: float
) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    module = TinyLM()
    callbacks: list[Any] = [
        ModelCheckpoint(dirpath=out / version, every_n_train_steps=EVERY, save_top_k=-1, save_last=False)
    ]
    if monitored:
        callbacks.append(SMonCallback())
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        accumulate_grad_batches=ACCUMULATE,
        val_check_interval=EVERY * ACCUMULATE,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=CSVLogger(out, name=prefix, version=version),
        log_every_n_steps=1,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    slow_down(module.net, delay if trainer.global_rank == slow_rank else 0.0)
    trainer.fit(module, DataLoader(Tokens(), batch_size=4), DataLoader(Tokens(16, seed=1), batch_size=8))
    return {"losses": module.losses, "params": checksum(module)}


def runs(out: Path, prefix: str, slow_rank: int, delay: float) -> dict[str, dict[str, Any]]:
    return {
        "healthy": run(out, prefix, "healthy", True, -1, 0.0),
        "slow": run(out, prefix, "slow", True, slow_rank, delay),
        "plain": run(out, prefix, "plain", False, -1, 0.0),
    }


if __name__ == "__main__":
    main(runs)
