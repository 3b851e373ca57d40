"""Hugging Face Accelerate: `mon = smon.integrations.accelerate.attach(accelerator, model)` after
`model, optimizer, loader = accelerator.prepare(...)`.

The loop is the user's, so SMon takes what `prepare` made: the prepared model as passed (the DDP
wrapper: Accelerate keeps only the unwrapped model for DDP, which leaves the gradient sync out of
SMon's view, so pass the model `prepare` returned), the torch optimizer inside
`AcceleratedOptimizer` (its step runs
only when gradients sync, so `accelerator.accumulate(...)` makes one step of N micro-batches),
and the training dataloader when only one was prepared (else pass `dataloader=`). The rank is
the accelerator's process index; dp / tp / cp coordinates come from its device mesh when a
ParallelismConfig built one. The job is named after the tracker run (`init_trackers`'
project_name) unless SMON_JOB or `job=` is set. `accelerator.save_state` / `save_model` are timed
as `checkpoint`, `accelerator.log` as `log`; evaluation forwards (model in eval mode or under
no_grad) are recorded as `eval` by the agent itself, and `with mon.phase("eval"):` times a whole
evaluation loop. `accelerator.end_training()` closes the monitor.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from smon.integrations.base import (
    CHECKPOINT,
    LOG,
    PhaseTimers,
    start,
    torch_loader,
    torch_optimizer,
)
from smon.monitor import Monitor

logger = logging.getLogger("smon")

__all__ = ["attach"]


def attach(
    accelerator: Any,
    model: Any = None,
    optimizer: Any = None,
    dataloader: Any = None,
    **attach_kwargs: Any,
) -> Monitor:
    """Monitor the loop around `accelerator`; keywords go to `smon.attach`."""
    try:
        models = list(getattr(accelerator, "_models", []) or [])
        optimizers = list(getattr(accelerator, "_optimizers", []) or [])
        loaders = list(getattr(accelerator, "_dataloaders", []) or [])
        options: dict[str, Any] = {
            "model": model if model is not None else (models[0] if models else None),
            "optimizer": torch_optimizer(optimizer if optimizer is not None else (optimizers or [None])[0]),
            "dataloader": torch_loader(dataloader if dataloader is not None else _only(loaders)),
            "job": attach_kwargs.pop("job", None),
            "rank": getattr(accelerator, "process_index", None),
            "world_size": getattr(accelerator, "num_processes", None),
            "local_rank": getattr(accelerator, "local_process_index", None),
            "mesh": _device_mesh(accelerator),
        }
        monitor = start("accelerate", **{**options, **attach_kwargs})
        if monitor.enabled:
            phases = PhaseTimers(monitor)
            phases.wrap(accelerator, "save_state", CHECKPOINT)
            phases.wrap(accelerator, "save_model", CHECKPOINT)
            phases.wrap(accelerator, "log", LOG)
            _close_at_end_training(accelerator, monitor, phases)
        return monitor
    except Exception as exc:
        logger.warning("smon: could not attach to the Accelerator (%r); training goes on unmonitored", exc)
        return Monitor()


def _only(loaders: list[Any]) -> Any:
    """The training loader when only one was prepared (with an eval loader too, which is which?)."""
    return loaders[0] if len(loaders) == 1 else None


def _device_mesh(accelerator: Any) -> Any:
    try:
        return getattr(accelerator, "torch_device_mesh", None)
    except Exception:
        return None


def _close_at_end_training(accelerator: Any, monitor: Monitor, phases: PhaseTimers) -> None:
    original = getattr(accelerator, "end_training", None)
    if not callable(original):
        return

    def end_training(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            phases.restore()
            with contextlib.suppress(AttributeError):
                del accelerator.end_training
            monitor.close()

    accelerator.end_training = end_training
