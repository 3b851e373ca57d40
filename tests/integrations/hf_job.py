"""Hugging Face Trainer under torchrun (gloo, CPU) with `callbacks=[SMonCallback()]`.

`hf_job.py OUT PREFIX --slow-rank R --delay S`: runs `PREFIX-healthy`, `PREFIX-slow` and
`PREFIX-plain` (see jobs.py); the run names are the jobs' ids on the server (SMON_JOB unset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import Trainer, TrainingArguments

from smon.integrations.transformers import SMonCallback
from tests.integrations.jobs import Tokens, checksum, main, slow_down, tiny_gpt2

STEPS, ACCUMULATE, EVERY = 16, 2, 8


def run(out: Path, name: str, monitored: bool, slow_rank: int, delay: float) -> dict[str, Any]:
    model = tiny_gpt2()
    args = TrainingArguments(
        output_dir=str(out / name),
        run_name=name,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=ACCUMULATE,
        max_steps=STEPS,
        learning_rate=1e-3,
        eval_strategy="steps",
        eval_steps=EVERY,
        save_strategy="steps",
        save_steps=EVERY,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        seed=0,
        data_seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    slow_down(model, delay if args.process_index == slow_rank else 0.0)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(),
        eval_dataset=Tokens(16, seed=1),
        callbacks=[SMonCallback()] if monitored else [],
    )
    result = trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {"loss": result.training_loss, "losses": losses, "params": checksum(model)}


def runs(out: Path, prefix: str, slow_rank: int, delay: float) -> dict[str, dict[str, Any]]:
    return {
        "healthy": run(out, f"{prefix}-healthy", True, -1, 0.0),
        "slow": run(out, f"{prefix}-slow", True, slow_rank, delay),
        "plain": run(out, f"{prefix}-plain", False, -1, 0.0),
    }


if __name__ == "__main__":
    main(runs)
