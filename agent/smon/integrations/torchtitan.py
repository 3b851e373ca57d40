"""torchtitan: `smon.integrations.torchtitan.attach(trainer)`, or the `SMonTrainer` subclass.

torchtitan (0.3) has no callback registry: its extension point is the Trainer class a config
builds (`Trainer.Config` -> `Trainer`, as torchtitan's own experiments extend it). Two ways in:
- return `SMonTrainer.Config(...)` instead of `Trainer.Config(...)` from your config function:
  the Trainer it builds attaches SMon at the end of `__init__` and closes it in `close()`;
- or, in your own entry point, `smon.integrations.torchtitan.attach(trainer)` after
  `config.build()`.

What is hooked: `trainer.model_parts` (each a model chunk: pipeline stages, virtual stages),
`trainer.optimizers` (the OptimizersContainer, a torch Optimizer: steps end at its step), the
dataloader, and as phases `trainer.checkpointer.save` (`checkpoint`), `trainer.validator.validate`
(`eval`) and `trainer.metrics_processor.log` (`log`). Coordinates are read from
`trainer.parallel_dims` (its mesh order is pp, dp_replicate, dp_shard, cp, tp; dp folds
dp_replicate x dp_shard, tp folds cp x tp) without building a mesh. The job is named after
WANDB_RUN_NAME (the run name torchtitan's own W&B logger uses) unless SMON_JOB is set.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from smon.config import env_int
from smon.integrations.base import CHECKPOINT, EVAL, LOG, PhaseTimers, job_name, start
from smon.monitor import Monitor

logger = logging.getLogger("smon")

__all__ = ["SMonTrainer", "attach"]  # noqa: F822 (SMonTrainer is built on first use, below)


def attach(trainer: Any, **attach_kwargs: Any) -> Monitor:
    """Monitor a built torchtitan Trainer; keywords go to `smon.attach`."""
    try:
        options: dict[str, Any] = {
            "model": list(getattr(trainer, "model_parts", None) or []) or None,
            "optimizer": getattr(trainer, "optimizers", None),
            "dataloader": getattr(trainer, "dataloader", None),
            "job": attach_kwargs.pop("job", None) or job_name(os.environ.get("WANDB_RUN_NAME")),
            "start_step": int(getattr(trainer, "step", 0) or 0),
            **_rank(),
            **parallel_coordinates(getattr(trainer, "parallel_dims", None), _rank().get("rank", _env_rank())),
        }
        monitor = start("torchtitan", **{**options, **attach_kwargs})
        if monitor.enabled:
            phases = PhaseTimers(monitor)
            phases.wrap(getattr(trainer, "checkpointer", None), "save", CHECKPOINT)
            phases.wrap(getattr(trainer, "validator", None), "validate", EVAL)
            phases.wrap(getattr(trainer, "metrics_processor", None), "log", LOG)
        return monitor
    except Exception as exc:
        logger.warning(
            "smon: could not attach to the torchtitan Trainer (%r); training goes on unmonitored", exc
        )
        return Monitor()


def parallel_coordinates(dims: Any, rank: int | None) -> dict[str, int]:
    """dp / pp / tp rank and size of global `rank` in torchtitan's mesh order."""
    if dims is None or rank is None:
        return {}
    try:
        pp, dpr, dps = int(dims.pp), int(dims.dp_replicate), int(dims.dp_shard)
        cp, tp = int(dims.cp), int(dims.tp)
    except (AttributeError, TypeError, ValueError):
        return {}
    if min(pp, dpr, dps, cp, tp) < 1:  # dp_shard -1 ("the rest") is resolved at init; not yet
        return {}
    inner = tp * cp * dps * dpr
    return {
        "tp_rank": ((rank // tp) % cp) * tp + rank % tp,
        "tp_size": cp * tp,
        "dp_rank": ((rank // (tp * cp * dps)) % dpr) * dps + (rank // (tp * cp)) % dps,
        "dp_size": dpr * dps,
        "pp_rank": (rank // inner) % pp,
        "pp_size": pp,
    }


def _rank() -> dict[str, int]:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
    except Exception:
        pass
    return {}


def _env_rank() -> int:
    return env_int("RANK") or 0


def __getattr__(name: str) -> Any:
    """`SMonTrainer` is built on first use: it subclasses torchtitan's Trainer, whose import is
    slow and needs torchtitan installed; `attach` needs neither."""
    if name == "SMonTrainer":
        cls = _smon_trainer()
        globals()["SMonTrainer"] = cls
        return cls
    raise AttributeError(name)


def _smon_trainer() -> type:
    from dataclasses import dataclass

    from torchtitan.trainer import Trainer

    class SMonTrainer(Trainer):
        """torchtitan's Trainer with SMon attached at the end of construction."""

        @dataclass(kw_only=True, slots=True)
        class Config(Trainer.Config):
            pass

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.smon = attach(self)

        def close(self) -> None:
            smon = getattr(self, "smon", None)
            if smon is not None:
                smon.close()
            super().close()

    return SMonTrainer
