"""DeepSpeed: `mon = smon.integrations.deepspeed.attach(model_engine)` after `deepspeed.initialize`.

The engine runs the loop's three calls (`model_engine(batch)`, `model_engine.backward(loss)`,
`model_engine.step()`), so SMon hooks the engine: forward and backward through the engine module,
the exposed gradient reduction (`allreduce_gradients`, which the engine runs at the accumulation
boundary for ZeRO 0-2) as `grad_sync`, the optimizer update (`_take_model_step`) as `optimizer`,
and a step ends when `engine.step()` has advanced the global step: once per accumulation
boundary, so gradient accumulation is one step. Coordinates come from the pipeline engine's
grid (stage, data-parallel id, slice/tensor-parallel rank) or the model-parallel unit (`mpu`) the
engine was given, else pure data parallel. The job is named after the monitor config's
`job_name` (wandb / tensorboard / csv_monitor / comet) when set to other than DeepSpeed's
default, unless SMON_JOB is set. `save_checkpoint` is timed as `checkpoint`, `eval_batch`
(pipeline engines) as `eval`, the monitor's `write_events` as `log`.
"""

from __future__ import annotations

import logging
from typing import Any

from smon.integrations.base import CHECKPOINT, EVAL, LOG, PhaseTimers, job_name, start
from smon.monitor import Monitor

logger = logging.getLogger("smon")

__all__ = ["attach"]

DEFAULT_JOB_NAME = "DeepSpeedJobName"


def attach(engine: Any, **attach_kwargs: Any) -> Monitor:
    """Monitor training through `engine` (a DeepSpeedEngine); keywords go to `smon.attach`."""
    try:
        options: dict[str, Any] = {
            "model": engine,
            "job": attach_kwargs.pop("job", None) or job_name(_run_name(engine)),
            "rank": getattr(engine, "global_rank", None),
            "start_step": int(getattr(engine, "global_steps", 0) or 0),
            **_coordinates(engine),
        }
        monitor = start("deepspeed", **{**options, **attach_kwargs})
        if monitor.enabled:
            phases = PhaseTimers(monitor)
            phases.wrap(engine, "allreduce_gradients", "grad_sync")
            phases.wrap(engine, "_take_model_step", "optimizer")
            phases.wrap(engine, "save_checkpoint", CHECKPOINT)
            phases.wrap(engine, "eval_batch", EVAL)
            phases.wrap(getattr(engine, "monitor", None), "write_events", LOG)
            _end_steps_at_boundaries(engine, monitor)
        return monitor
    except Exception as exc:
        logger.warning(
            "smon: could not attach to the DeepSpeed engine (%r); training goes on unmonitored", exc
        )
        return Monitor()


def _end_steps_at_boundaries(engine: Any, monitor: Monitor) -> None:
    original = engine.step

    def step(*args: Any, **kwargs: Any) -> Any:
        before = getattr(engine, "global_steps", None)
        try:
            return original(*args, **kwargs)
        finally:
            if getattr(engine, "global_steps", None) != before:
                monitor.step()

    engine.step = step


def _run_name(engine: Any) -> str | None:
    config = getattr(getattr(engine, "_config", None), "monitor_config", None)
    for section in ("wandb", "tensorboard", "csv_monitor", "comet"):
        part = getattr(config, section, None)
        name = getattr(part, "job_name", None) or getattr(part, "experiment_name", None)
        if getattr(part, "enabled", False) and name and name != DEFAULT_JOB_NAME:
            return str(name)
    return None


def _coordinates(engine: Any) -> dict[str, int]:
    """dp / pp / tp from the pipeline grid or the model-parallel unit; {} when there is neither."""
    try:
        grid = getattr(engine, "grid", None)
        if grid is not None:
            return {
                "dp_rank": grid.get_data_parallel_rank(),
                "dp_size": grid.get_data_parallel_world_size(),
                "pp_rank": grid.get_stage_id(),
                "pp_size": grid.get_pipe_parallel_world_size(),
                "tp_rank": grid.get_slice_parallel_rank(),
                "tp_size": grid.get_slice_parallel_world_size(),
            }
        mpu = getattr(engine, "mpu", None)
        if mpu is not None:
            out = {
                "dp_rank": mpu.get_data_parallel_rank(),
                "dp_size": mpu.get_data_parallel_world_size(),
                "tp_rank": mpu.get_model_parallel_rank(),
                "tp_size": mpu.get_model_parallel_world_size(),
            }
            if hasattr(mpu, "get_pipeline_model_parallel_rank"):
                out["pp_rank"] = mpu.get_pipeline_model_parallel_rank()
                out["pp_size"] = mpu.get_pipeline_model_parallel_world_size()
            return out
    except Exception as exc:
        logger.info("smon: could not read DeepSpeed's parallel layout (%r); assuming data parallel", exc)
    return {}
