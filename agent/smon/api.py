"""`smon.attach()`: resolve settings and coordinates, pick the timing backend, install hooks, start.

attach never raises into the training script: if something unexpected fails while starting, it
logs why and returns the no-op `Monitor`, so a monitoring problem can never stop a training run.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from smon._version import __version__
from smon.config import env_flag, resolve_config
from smon.coords import (
    build_coordinates,
    distributed_backend,
    process_identity,
    resolve_attempt,
    resolve_job,
    resolve_parallel,
)
from smon.monitor import ActiveMonitor, Monitor
from smon.timing import Clock, HostClock

logger = logging.getLogger("smon")


def attach(
    model: Any = None,
    optimizer: Any = None,
    dataloader: Any = None,
    *,
    job: str | None = None,
    attempt: int | None = None,
    server: str | None = None,
    token: str | None = None,
    dp_rank: int | None = None,
    pp_rank: int | None = None,
    tp_rank: int | None = None,
    dp_size: int | None = None,
    pp_size: int | None = None,
    tp_size: int | None = None,
    mesh: Any = None,
    start_step: int = 0,
    enable: bool = True,
    timing: str | Clock = "auto",
    nvml: Any = None,
    nvml_interval: float | None = None,
    flush_interval: float | None = None,
    heartbeat_interval: float | None = None,
    flush_timeout: float | None = None,
    queue_size: int | None = None,
    max_batch_records: int | None = None,
    backoff_base: float | None = None,
    backoff_cap: float | None = None,
    tls: bool | None = None,
    tls_ca_file: str | None = None,
    device_sampling: int | str | None = None,
) -> Monitor:
    """Start monitoring this rank; returns the `Monitor` handle.

    model: the root module (DDP-wrapped or not), or a list of model chunks (interleaved pipeline
        stages; the list index is `Span.chunk`). Adds forward / backward (/ grad_sync) spans.
    optimizer: ends each step when `optimizer.step()` returns and adds the `optimizer` span.
        Without it, call `mon.step()` at the end of each step.
    dataloader: any iterable object whose class can be subclassed; adds `data_wait` spans.
    job, server, token: default `SMON_JOB` (else TORCHELASTIC_RUN_ID / generated),
        `SMON_SERVER` (127.0.0.1:50051), `SMON_TOKEN`.
    attempt: which run of the job this is (a non-negative integer that grows with each run);
        default `SMON_ATTEMPT`, else torchrun's / Slurm's restart count, else unset. A larger
        value than the job's current attempt starts a new attempt on the server.
    tls, tls_ca_file: TLS to the server, with the system's root certificates or those of a PEM
        file (default `SMON_TLS=1`, `SMON_TLS_CA`; a CA file implies TLS).
    dp/pp/tp_rank, *_size, mesh: parallel coordinates (else SMON_*_RANK / SMON_*_SIZE, else
        detected from a DeviceMesh or Megatron's parallel_state, else pure data parallel).
    start_step: number of the first step (resuming from a checkpoint).
    enable: False (or SMON_DISABLE=1) returns a Monitor whose every method does nothing.
    timing: "auto" (CUDA events when the model lives on a GPU, else wall clock), "host", "cuda",
        or a Clock object.
    device_sampling: with CUDA timing, which steps are device-timed and recorded: "auto" (about
        ten a second, every step from ~100 ms up; docs/agent.md) or a period N (blocks of steps
        one in N; 1 = every step). Default SMON_AGENT_DEVICE_SAMPLING, else auto.
    nvml: a pynvml-shaped module for the GPU sampler (tests: smon.testing.FakeNvml); default
        pynvml, or FakeNvml.from_spec($SMON_FAKE_NVML) when that variable is set.
    The remaining keywords tune intervals and sizes (see docs/agent.md); environment variables
    SMON_NVML_INTERVAL and SMON_AGENT_{FLUSH_INTERVAL, HEARTBEAT_INTERVAL, FLUSH_TIMEOUT,
    QUEUE_SIZE, BATCH_RECORDS, BACKOFF_BASE, BACKOFF_CAP} do the same.
    """
    if not enable or env_flag("SMON_DISABLE"):
        return Monitor()
    try:
        return _attach(**locals())
    except Exception as exc:
        logger.warning("smon: could not start (%r); training continues without monitoring", exc, exc_info=exc)
        return Monitor()


def _attach(
    *,
    model: Any,
    optimizer: Any,
    dataloader: Any,
    job: str | None,
    attempt: int | None,
    server: str | None,
    token: str | None,
    dp_rank: int | None,
    pp_rank: int | None,
    tp_rank: int | None,
    dp_size: int | None,
    pp_size: int | None,
    tp_size: int | None,
    mesh: Any,
    start_step: int,
    enable: bool,
    timing: str | Clock,
    nvml: Any,
    **tuning: Any,
) -> Monitor:
    config = resolve_config(server=server, token=token, **tuning)
    identity = process_identity()
    parallel = resolve_parallel(
        identity,
        explicit={
            "dp_rank": dp_rank,
            "pp_rank": pp_rank,
            "tp_rank": tp_rank,
            "dp_size": dp_size,
            "pp_size": pp_size,
            "tp_size": tp_size,
        },
        mesh=mesh,
    )
    models: list[Any] = _as_models(model)
    clock, gpu_uuid = _choose_clock(timing, models, config.device_sampling)
    coords = build_coordinates(
        job=resolve_job(job, identity),
        identity=identity,
        parallel=parallel,
        gpu_uuid=gpu_uuid,
        version=__version__,
        backend=distributed_backend(),
        attempt=resolve_attempt(attempt),
    )
    if nvml is None and os.environ.get("SMON_FAKE_NVML", "").strip():
        from smon.testing import FakeNvml

        nvml = FakeNvml.from_spec(os.environ["SMON_FAKE_NVML"])
    monitor = ActiveMonitor(
        config=config,
        coords=coords,
        clock=clock,
        start_step=start_step,
        nvml=nvml,
        local_rank=identity.local_rank,
        gpu_uuid=gpu_uuid,
    )
    try:
        monitor.instrument(models, optimizer, dataloader)
        monitor.start()
    except Exception:
        monitor.close(timeout=0.0)  # take back whatever hooks were installed
        raise
    logger.info(
        "smon: attached rank %d/%d of job %s, attempt %s "
        "(dp %d/%d, pp %d/%d, tp %d/%d from %s; %s timing) -> %s",
        identity.rank,
        identity.world_size,
        coords.job,
        coords.attempt if coords.HasField("attempt") else "unset",
        parallel.dp_rank,
        parallel.dp_size,
        parallel.pp_rank,
        parallel.pp_size,
        parallel.tp_rank,
        parallel.tp_size,
        parallel.source,
        "cuda" if clock.device else "host",
        config.server,
    )
    return monitor


def _as_models(model: Any) -> list[Any]:
    if model is None:
        return []
    if isinstance(model, (list, tuple)):
        return [m for m in model if m is not None]
    if isinstance(model, Sequence) and not hasattr(model, "forward"):
        return list(model)
    return [model]  # a torch ModuleList is a module: hooked as one root


def _choose_clock(timing: str | Clock, models: list[Any], device_sampling: int | None) -> tuple[Clock, str]:
    """The timing backend and, when known, the GPU's UUID (as NVML spells it)."""
    device = _cuda_device(models) if timing in ("auto", "cuda") else None
    gpu_uuid = _gpu_uuid(device) if device is not None else ""
    if not isinstance(timing, str):
        return timing, gpu_uuid
    if device is not None:
        from smon.cuda_timing import CudaClock
        from smon.sampling import DeviceSampling

        return CudaClock.for_device(device, DeviceSampling(device_sampling)), gpu_uuid
    if timing == "cuda":
        logger.warning("smon: timing='cuda' but no CUDA device is in use; using wall-clock timing")
    return HostClock(), gpu_uuid


def _cuda_device(models: list[Any]) -> Any:
    """The CUDA device the model's parameters live on; else the current device if CUDA is in use."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for model in models:
        try:
            param = next(iter(model.parameters()), None)
        except Exception:
            continue
        if param is not None:
            return param.device if param.device.type == "cuda" else None
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.device("cuda", torch.cuda.current_device())
    except Exception:
        pass
    return None


def _gpu_uuid(device: Any) -> str:
    try:
        import torch

        return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
    except Exception:
        return ""
