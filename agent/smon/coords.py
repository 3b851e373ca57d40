"""Where this rank sits in the job: global rank, host, job id, attempt and its (dp, pp, tp)
coordinates.

Precedence, field by field: `attach()` arguments > `SMON_{DP,PP,TP}_{RANK,SIZE}` > detection
(a torch `DeviceMesh` passed to attach, else Megatron's `parallel_state` when that module is
already imported and initialized) > defaults. Detection never imports Megatron and never runs a
collective: it only reads state the training framework already holds.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from smon.config import env_int
from smon.v1 import ingest_pb2 as pb

logger = logging.getLogger("smon")

# DeviceMesh dimension names (lower case) folded into each coordinate, in the naming used by
# torchtitan, torch's own examples and common custom meshes. Context / sequence parallel peers run
# in lockstep with tensor parallel ones, so they fold into the tp coordinate (DESIGN §5).
_DP_DIMS = frozenset(
    {"dp", "ddp", "fsdp", "hsdp", "data", "data_parallel", "dp_replicate", "dp_shard", "replicate", "shard"}
)
_PP_DIMS = frozenset({"pp", "pipeline", "pipeline_parallel"})
_TP_DIMS = frozenset({"tp", "tensor", "tensor_parallel", "cp", "context_parallel", "sp"})


@dataclass(frozen=True)
class ParallelCoords:
    """(rank, size) along the data-, pipeline- and tensor-parallel axes, and where they came from."""

    dp_rank: int
    dp_size: int
    pp_rank: int
    pp_size: int
    tp_rank: int
    tp_size: int
    source: str


@dataclass(frozen=True)
class ProcessIdentity:
    """The torchrun-level identity of this process."""

    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int


def process_identity(
    rank: int | None = None, world_size: int | None = None, local_rank: int | None = None
) -> ProcessIdentity:
    """RANK / WORLD_SIZE / LOCAL_RANK as torchrun sets them (a single process otherwise); the
    arguments, when given, win: launchers that set no RANK (Lightning's own, MPI) know them.
    The host is SMON_HOST when set (a container whose host name is the pod's names the node it
    runs on), else the machine's host name."""
    rank = rank if rank is not None else env_int("RANK") or 0
    world_size = world_size if world_size is not None else env_int("WORLD_SIZE") or 1
    local_rank = local_rank if local_rank is not None else env_int("LOCAL_RANK")
    return ProcessIdentity(
        rank=rank,
        world_size=max(world_size, rank + 1),
        local_rank=rank if local_rank is None else local_rank,
        host=os.environ.get("SMON_HOST", "").strip() or socket.gethostname(),
        pid=os.getpid(),
    )


def resolve_job(job: str | None, identity: ProcessIdentity) -> str:
    """Job id: argument > SMON_JOB > TORCHELASTIC_RUN_ID > SLURM_JOB_ID > generated.

    A generated id must agree across ranks without talking to them, so for a multi-rank job it is
    derived from the rendezvous endpoint every rank shares (MASTER_ADDR:MASTER_PORT, WORLD_SIZE).
    That is only unique while the endpoint is, hence the warning.
    """
    if job:
        return job
    for name in ("SMON_JOB", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(name, "").strip()
        if value and value.lower() != "none":  # torchrun's default --rdzv-id is the string "none"
            return value
    slurm = os.environ.get("SLURM_JOB_ID", "").strip()
    if slurm:
        return f"slurm-{slurm}"
    master = os.environ.get("MASTER_ADDR", "").strip()
    if identity.world_size > 1 and master:
        key = f"{master}:{os.environ.get('MASTER_PORT', '')}:{identity.world_size}"
        generated = "job-" + hashlib.sha1(key.encode()).hexdigest()[:12]
        if identity.rank == 0:
            logger.warning(
                "smon: no SMON_JOB / TORCHELASTIC_RUN_ID set; using job id %s derived from %s "
                "(set SMON_JOB to name the job)",
                generated,
                key,
            )
        return generated
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{identity.host}-{identity.pid}-{stamp}"


# Under torchrun inside a Slurm job both launchers count restarts, and a Slurm requeue starts
# torchrun's count at 0 again: the requeue count leads, torchrun's count fills the low bits.
SLURM_RESTART_WEIGHT = 1 << 20


def resolve_attempt(attempt: int | None) -> int | None:
    """Which run of the job this process is: argument > SMON_ATTEMPT > the launchers' restart
    counts (TORCHELASTIC_RESTART_COUNT; SLURM_RESTART_COUNT, 0 in a Slurm job not yet requeued;
    under both, SLURM_RESTART_COUNT * 2^20 + TORCHELASTIC_RESTART_COUNT) > None.

    The server only compares these: a process reporting more than its job's current attempt
    starts a new attempt. None leaves the server to judge by liveness (docs/server.md)."""
    if attempt is not None:
        if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0:
            return attempt
        logger.warning("smon: ignoring attempt=%r (not a non-negative integer)", attempt)
    explicit = _count("SMON_ATTEMPT")
    if explicit is not None:
        return explicit
    elastic = _count("TORCHELASTIC_RESTART_COUNT")
    slurm = _count("SLURM_RESTART_COUNT")
    if slurm is None and os.environ.get("SLURM_JOB_ID", "").strip():
        slurm = 0
    if slurm is None or elastic is None:
        return elastic if slurm is None else slurm
    return slurm * SLURM_RESTART_WEIGHT + elastic


def _count(name: str) -> int | None:
    value = env_int(name)
    if value is not None and value < 0:
        logger.warning("smon: ignoring %s=%d (a count cannot be negative)", name, value)
        return None
    return value


def _from_mesh(mesh: Any) -> dict[str, int]:
    """Fold a DeviceMesh's named dimensions into dp / pp / tp (mixed radix, mesh order)."""
    names = [str(n).lower() for n in (getattr(mesh, "mesh_dim_names", None) or ())]
    if not names:
        return {}
    found: dict[str, int] = {}
    for axis, dims in (("dp", _DP_DIMS), ("pp", _PP_DIMS), ("tp", _TP_DIMS)):
        rank, size, present = 0, 1, False
        for index, name in enumerate(names):
            if name in dims:
                dim_size = int(mesh.size(index))  # DeviceMesh.size takes the dimension's index
                rank = rank * dim_size + int(mesh.get_local_rank(index))
                size *= dim_size
                present = True
        if present:
            found[f"{axis}_rank"] = rank
            found[f"{axis}_size"] = size
    return found


def _from_megatron() -> dict[str, int]:
    """Read Megatron-Core's parallel_state, only if the training script already imported it."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:
        return {}
    try:
        if not ps.model_parallel_is_initialized():
            return {}
        tp_rank = ps.get_tensor_model_parallel_rank()
        tp_size = ps.get_tensor_model_parallel_world_size()
        cp_rank, cp_size = 0, 1
        if hasattr(ps, "get_context_parallel_rank"):
            cp_rank = ps.get_context_parallel_rank()
            cp_size = ps.get_context_parallel_world_size()
        return {
            "dp_rank": ps.get_data_parallel_rank(),
            "dp_size": ps.get_data_parallel_world_size(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "pp_size": ps.get_pipeline_model_parallel_world_size(),
            "tp_rank": cp_rank * tp_size + tp_rank,
            "tp_size": cp_size * tp_size,
        }
    except Exception as exc:  # a half-initialized Megatron must not stop attach
        logger.info("smon: could not read Megatron parallel_state (%r); using other sources", exc)
        return {}


def resolve_parallel(
    identity: ProcessIdentity,
    *,
    explicit: Mapping[str, int | None],
    mesh: Any = None,
) -> ParallelCoords:
    """Combine arguments, environment, detection and defaults into one set of coordinates."""
    fields = ("dp_rank", "dp_size", "pp_rank", "pp_size", "tp_rank", "tp_size")
    values: dict[str, int] = {k: v for k, v in explicit.items() if v is not None}
    sources = ["arguments"] if values else []
    env_values = {k: env_int(f"SMON_{k.upper()}") for k in fields}
    env_found = {k: v for k, v in env_values.items() if v is not None and k not in values}
    if env_found:
        sources.append("environment")
        values.update(env_found)
    detected: dict[str, int] = {}
    if mesh is not None:
        try:
            detected = _from_mesh(mesh)
            if detected:
                sources.append("device_mesh")
        except Exception as exc:
            logger.info("smon: could not read the DeviceMesh (%r); using other sources", exc)
    if not detected:
        detected = _from_megatron()
        if detected:
            sources.append("megatron")
    for key, value in detected.items():
        values.setdefault(key, value)

    # Defaults follow Megatron's default rank order (tp fastest, then dp, then pp), which reduces
    # to pure data parallelism (dp_rank = rank) when nothing else is known.
    rank, world = identity.rank, identity.world_size
    tp_size = max(1, values.get("tp_size", 1))
    pp_size = max(1, values.get("pp_size", 1))
    dp_size = max(1, values.get("dp_size", max(1, world // (tp_size * pp_size))))
    return ParallelCoords(
        dp_rank=values.get("dp_rank", (rank // tp_size) % dp_size),
        dp_size=dp_size,
        pp_rank=values.get("pp_rank", (rank // (tp_size * dp_size)) % pp_size),
        pp_size=pp_size,
        tp_rank=values.get("tp_rank", rank % tp_size),
        tp_size=tp_size,
        source="+".join(sources) or "default",
    )


def distributed_backend() -> str:
    """The process group's backend, when the script imported torch and initialised it already."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception as exc:  # never stop attach over a diagnostic nicety
        logger.info("smon: could not read the torch.distributed backend (%r)", exc)
    return ""


def build_coordinates(
    *,
    job: str,
    identity: ProcessIdentity,
    parallel: ParallelCoords,
    gpu_uuid: str,
    version: str,
    backend: str = "",
    attempt: int | None = None,
) -> pb.Coordinates:
    return pb.Coordinates(
        attempt=attempt,
        job=job,
        rank=identity.rank,
        world_size=identity.world_size,
        local_rank=identity.local_rank,
        host=identity.host,
        gpu_uuid=gpu_uuid,
        dp_rank=parallel.dp_rank,
        pp_rank=parallel.pp_rank,
        tp_rank=parallel.tp_rank,
        dp_size=parallel.dp_size,
        pp_size=parallel.pp_size,
        tp_size=parallel.tp_size,
        pid=identity.pid,
        agent_version=version,
        backend=backend,
    )
