"""Hugging Face `transformers.Trainer`: `Trainer(..., callbacks=[SMonCallback()])`.

At `on_train_begin` the callback attaches SMon to what the Trainer built: the model as the
Trainer wrapped it (DDP / FSDP / DeepSpeed: `trainer.model_wrapped`), the torch optimizer inside
Accelerate's wrapper (steps end at its real step, so gradient accumulation is one step), and the
training dataloader. The rank comes from `TrainingArguments` (process index, world size), the
dp / tp / cp coordinates from Accelerate's device mesh when a ParallelismConfig built one. The
job is named after `args.run_name` unless SMON_JOB is set. `Trainer.evaluate`, the checkpoint
save and `Trainer.log` are timed as the phases `eval`, `checkpoint` and `log`.

The callback API hands callbacks the model, optimizer and loaders but not the Trainer; the
callback finds the Trainer in the frame that calls it (its `on_init_end` runs inside
`Trainer.__init__`), or takes it as `SMonCallback(trainer=...)`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from transformers import Trainer, TrainerCallback

from smon.integrations.base import (
    CHECKPOINT,
    EVAL,
    LOG,
    PhaseTimers,
    job_name,
    start,
    torch_loader,
    torch_optimizer,
)
from smon.monitor import Monitor

logger = logging.getLogger("smon")

__all__ = ["SMonCallback"]


class SMonCallback(TrainerCallback):
    """SMon for `transformers.Trainer`. Keyword arguments go to `smon.attach` (server, token,
    job, enable, ...); `trainer` is found by itself."""

    def __init__(self, trainer: Any = None, **attach_kwargs: Any) -> None:
        self.trainer = trainer
        self.attach_kwargs = attach_kwargs
        self.monitor: Monitor = Monitor()
        self._phases: PhaseTimers | None = None
        self._step_by_callback = False

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            self.trainer = _calling_trainer()

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        self._close()
        try:
            trainer = self.trainer or _calling_trainer()
            wrapped = getattr(trainer, "model_wrapped", None) if trainer is not None else None
            torch_opt = torch_optimizer(optimizer)
            options: dict[str, Any] = {
                "model": wrapped if wrapped is not None else model,
                "optimizer": torch_opt,
                "dataloader": torch_loader(train_dataloader),
                "job": job_name(getattr(args, "run_name", None)),
                "rank": getattr(args, "process_index", None),
                "world_size": getattr(args, "world_size", None),
                "local_rank": getattr(args, "local_process_index", None),
                "mesh": _device_mesh(trainer),
                "start_step": int(getattr(state, "global_step", 0) or 0),
            }
            self.monitor = start("transformers", **{**options, **self.attach_kwargs})
            # DeepSpeed's and other wrapped optimizers hide the torch one: end steps with the
            # Trainer's own step (after the optimizer, once per accumulated step).
            self._step_by_callback = torch_opt is None
            self._phases = PhaseTimers(self.monitor)
            if trainer is not None:
                self._phases.wrap(trainer, "evaluate", EVAL)
                if not self._phases.wrap(trainer, "_save_checkpoint", CHECKPOINT):
                    self._phases.wrap(trainer, "save_model", CHECKPOINT)
                self._phases.wrap(trainer, "log", LOG)
        except Exception as exc:
            logger.warning("smon: could not attach to the Trainer (%r); training goes on unmonitored", exc)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._step_by_callback:
            self.monitor.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._phases is not None:
            self._phases.restore()
            self._phases = None
        self.monitor.close()
        self.monitor = Monitor()


def _calling_trainer() -> Any:
    """The Trainer whose method is calling this callback (a few frames up)."""
    frame = sys._getframe(1)
    for _ in range(12):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _device_mesh(trainer: Any) -> Any:
    try:
        return getattr(trainer.accelerator, "torch_device_mesh", None)
    except Exception:
        return None
