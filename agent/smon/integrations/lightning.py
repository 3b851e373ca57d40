"""Lightning (`lightning.pytorch`): `Trainer(..., callbacks=[SMonCallback()])`.

At `on_train_start` the callback attaches SMon to the strategy's model (the DDP / FSDP wrapper
Lightning built), to the torch optimizer (with automatic optimization Lightning runs forward and
backward inside `optimizer.step(closure)`, and accumulated batches skip the step, so a step ends
once per optimizer step), and to the training DataLoader. Several optimizers or manual
optimization: steps end at each `accumulate_grad_batches`-th training batch instead. The rank is
the trainer's global rank (Lightning's own launcher sets no RANK); dp / tp coordinates come from
the strategy's device mesh where it has one (ModelParallelStrategy), else pure data parallel.
The job is named after the logger's run: `name-version` when the version was given as a string
(the same on every rank), else the logger's name unless it is Lightning's default
`lightning_logs`; SMON_JOB wins. Validation runs (`on_validation_start` .. `_end`) are the phase
`eval`, `trainer.save_checkpoint` (what ModelCheckpoint calls) `checkpoint`, and the loggers'
`log_metrics` `log`.
"""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.callbacks import Callback

from smon.integrations.base import (
    CHECKPOINT,
    EVAL,
    LOG,
    OpenPhase,
    PhaseTimers,
    job_name,
    start,
    torch_optimizer,
)
from smon.monitor import Monitor

logger = logging.getLogger("smon")

__all__ = ["SMonCallback"]

DEFAULT_LOGGER_NAME = "lightning_logs"


class SMonCallback(Callback):
    """SMon for Lightning. Keyword arguments go to `smon.attach` (server, token, job, ...)."""

    def __init__(self, **attach_kwargs: Any) -> None:
        super().__init__()
        self.attach_kwargs = attach_kwargs
        self.monitor: Monitor = Monitor()
        self._phases: PhaseTimers | None = None
        self._eval = OpenPhase(EVAL)
        self._step_every = 0  # > 0: end steps at training batches (no single torch optimizer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._close()
        try:
            optimizers = list(getattr(trainer, "optimizers", None) or [])
            automatic = bool(getattr(pl_module, "automatic_optimization", True))
            optimizer = torch_optimizer(optimizers[0]) if len(optimizers) == 1 and automatic else None
            strategy = trainer.strategy
            options: dict[str, Any] = {
                "model": getattr(strategy, "model", None) or pl_module,
                "optimizer": optimizer,
                "dataloader": _torch_loader(getattr(trainer, "train_dataloader", None)),
                "job": job_name(_run_name(trainer)),
                "rank": trainer.global_rank,
                "world_size": trainer.world_size,
                "local_rank": trainer.local_rank,
                "mesh": getattr(strategy, "device_mesh", None),
                "start_step": int(getattr(trainer, "global_step", 0) or 0),
            }
            self.monitor = start("lightning", **{**options, **self.attach_kwargs})
            self._step_every = 0 if optimizer is not None else max(1, int(trainer.accumulate_grad_batches))
            self._phases = PhaseTimers(self.monitor)
            self._phases.wrap(trainer, "save_checkpoint", CHECKPOINT)
            for each in getattr(trainer, "loggers", None) or []:
                self._phases.wrap(each, "log_metrics", LOG)
        except Exception as exc:
            logger.warning(
                "smon: could not attach to the Lightning Trainer (%r); training goes on unmonitored", exc
            )

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor.enabled:
            _sync_wrapper_modes(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._step_every and (batch_idx + 1) % self._step_every == 0:
            self.monitor.step()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval.begin(self.monitor)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval.end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        self._eval.end()
        if self._phases is not None:
            self._phases.restore()
            self._phases = None
        self.monitor.close()
        self.monitor = Monitor()


def _sync_wrapper_modes(trainer: Any, pl_module: Any) -> None:
    """Give Lightning's wrappers around the LightningModule (DDP, `_LightningModuleWrapperBase`)
    the module's train / eval flag. Validation calls `trainer.model.eval()` (the outermost
    wrapper, recursively) but restores the modes of the LightningModule's own modules only, so the
    wrappers, which SMon times, stay in eval mode and every later training forward would be taken
    for evaluation. Only the wrappers' own flag is set (not recursively): they hold no layers."""
    wrapper = getattr(trainer.strategy, "model", None)
    for _ in range(4):
        if wrapper is None or wrapper is pl_module:
            return
        if wrapper.training != pl_module.training:
            wrapper.training = pl_module.training
        wrapper = getattr(wrapper, "module", None) or getattr(wrapper, "_forward_module", None)


def _run_name(trainer: Any) -> str | None:
    run = getattr(trainer, "logger", None)
    if run is None:
        return None
    try:
        name = str(run.name or "")
    except Exception:
        return None
    version = getattr(run, "_version", None)
    if isinstance(version, str) and version:
        return f"{name}-{version}" if name else version
    return name if name and name != DEFAULT_LOGGER_NAME else None


def _torch_loader(loader: Any) -> Any:
    """The training DataLoader; None for several (a CombinedLoader's mapping or list of them)."""
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return None
    return loader if isinstance(loader, DataLoader) else None
