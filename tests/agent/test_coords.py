"""Coordinates, job id and attempt: arguments > environment > detection (DeviceMesh, Megatron,
launchers) > defaults."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from smon.coords import SLURM_RESTART_WEIGHT, process_identity, resolve_attempt, resolve_job, resolve_parallel

NONE = {"dp_rank": None, "pp_rank": None, "tp_rank": None, "dp_size": None, "pp_size": None, "tp_size": None}


def identity(monkeypatch: pytest.MonkeyPatch, rank: int, world: int, local: int | None = None):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    if local is not None:
        monkeypatch.setenv("LOCAL_RANK", str(local))
    return process_identity()


def test_torchrun_environment(monkeypatch):
    ident = identity(monkeypatch, 5, 8, 1)
    assert (ident.rank, ident.world_size, ident.local_rank) == (5, 8, 1)


def test_default_is_pure_data_parallel(monkeypatch):
    p = resolve_parallel(identity(monkeypatch, 5, 8), explicit=NONE)
    assert (p.dp_rank, p.dp_size, p.pp_rank, p.pp_size, p.tp_rank, p.tp_size) == (5, 8, 0, 1, 0, 1)
    assert p.source == "default"


def test_sizes_alone_give_megatron_order_ranks(monkeypatch):
    monkeypatch.setenv("SMON_TP_SIZE", "2")
    monkeypatch.setenv("SMON_PP_SIZE", "2")
    p = resolve_parallel(identity(monkeypatch, 7, 8), explicit=NONE)  # tp fastest, then dp, then pp
    assert (p.tp_rank, p.dp_rank, p.dp_size, p.pp_rank) == (1, 1, 2, 1)


def test_arguments_beat_environment_beat_detection(monkeypatch):
    monkeypatch.setenv("SMON_DP_RANK", "3")
    monkeypatch.setenv("SMON_PP_RANK", "1")
    ps = types.ModuleType("megatron.core.parallel_state")
    ps.model_parallel_is_initialized = lambda: True  # type: ignore[attr-defined]
    for name, value in [
        ("data_parallel_rank", 6),
        ("data_parallel_world_size", 8),
        ("pipeline_model_parallel_rank", 2),
        ("pipeline_model_parallel_world_size", 4),
        ("tensor_model_parallel_rank", 1),
        ("tensor_model_parallel_world_size", 2),
        ("context_parallel_rank", 1),
        ("context_parallel_world_size", 2),
    ]:
        setattr(ps, f"get_{name}", lambda v=value: v)
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", ps)
    p = resolve_parallel(identity(monkeypatch, 0, 64), explicit={**NONE, "dp_rank": 9})
    assert p.dp_rank == 9  # argument
    assert p.pp_rank == 1  # environment
    assert (p.dp_size, p.pp_size) == (8, 4)  # Megatron
    assert (p.tp_rank, p.tp_size) == (1 * 2 + 1, 4)  # cp folded into tp
    assert p.source == "arguments+environment+megatron"


def test_uninitialized_megatron_is_ignored(monkeypatch):
    ps = types.ModuleType("megatron.core.parallel_state")
    ps.model_parallel_is_initialized = lambda: False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", ps)
    assert resolve_parallel(identity(monkeypatch, 2, 4), explicit=NONE).source == "default"


class FakeMesh:
    """DeviceMesh-shaped: named dims, their sizes and this rank's coordinate on each."""

    def __init__(self, dims: dict[str, tuple[int, int]]) -> None:
        self.mesh_dim_names = tuple(dims)
        self._dims = dims

    def size(self, dim: int) -> int:
        return self._dims[self.mesh_dim_names[dim]][0]

    def get_local_rank(self, dim: int) -> int:
        return self._dims[self.mesh_dim_names[dim]][1]


def test_device_mesh_dims_fold_into_dp_pp_tp(monkeypatch):
    mesh = FakeMesh({"pp": (2, 1), "dp_replicate": (2, 1), "dp_shard": (4, 2), "cp": (2, 0), "tp": (2, 1)})
    p = resolve_parallel(identity(monkeypatch, 0, 64), explicit=NONE, mesh=mesh)
    assert (p.pp_rank, p.pp_size) == (1, 2)
    assert (p.dp_rank, p.dp_size) == (1 * 4 + 2, 8)
    assert (p.tp_rank, p.tp_size) == (0 * 2 + 1, 4)
    assert p.source == "device_mesh"


def test_real_device_mesh(monkeypatch):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from tests.agent.conftest import unused_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(unused_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        p = resolve_parallel(identity(monkeypatch, 0, 1), explicit=NONE, mesh=mesh)
        assert (p.dp_rank, p.dp_size, p.tp_rank, p.tp_size, p.source) == (0, 1, 0, 1, "device_mesh")
    finally:
        dist.destroy_process_group()


def test_job_id_sources(monkeypatch):
    ident = identity(monkeypatch, 0, 1)
    assert resolve_job("given", ident) == "given"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default: not an id
    assert resolve_job(None, ident).startswith(ident.host)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-42")
    assert resolve_job(None, ident) == "run-42"
    monkeypatch.setenv("SMON_JOB", "mine")
    assert resolve_job(None, ident) == "mine"


def test_generated_job_id_agrees_across_ranks(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "29500")
    ids = {resolve_job(None, identity(monkeypatch, r, 4)) for r in range(4)}
    assert len(ids) == 1 and next(iter(ids)).startswith("job-")


def test_coordinates_travel_with_every_batch(ingest, attach_fast, monkeypatch):
    identity(monkeypatch, 3, 4, 1)
    monkeypatch.setenv("SMON_PP_RANK", "1")
    monkeypatch.setenv("SMON_PP_SIZE", "2")
    mon = attach_fast(server=ingest.address, job="coords-job")
    mon.step()
    mon.close()
    coords = ingest.servicer.snapshot()[0].coords
    assert (coords.job, coords.rank, coords.world_size, coords.local_rank) == ("coords-job", 3, 4, 1)
    assert (coords.dp_rank, coords.dp_size, coords.pp_rank, coords.pp_size) == (1, 2, 1, 2)
    assert coords.host and coords.pid and coords.agent_version


def test_attempt_sources(monkeypatch):
    assert resolve_attempt(None) is None  # nothing says: the server goes by liveness
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert resolve_attempt(None) == 0  # a Slurm job not requeued yet
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert resolve_attempt(None) == 2
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    # torchrun inside Slurm: a requeue restarts torchrun's count, so the requeue count leads.
    assert resolve_attempt(None) == 2 * SLURM_RESTART_WEIGHT + 1
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    assert resolve_attempt(None) == 1  # torchrun alone
    monkeypatch.setenv("SMON_ATTEMPT", "7")
    assert resolve_attempt(None) == 7
    assert resolve_attempt(3) == 3


def test_bad_attempts_are_ignored_with_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "4")
    monkeypatch.setenv("SMON_ATTEMPT", "second")
    assert resolve_attempt(None) == 4
    monkeypatch.setenv("SMON_ATTEMPT", "-1")
    assert resolve_attempt(None) == 4
    assert resolve_attempt(-2) == 4 and resolve_attempt("3") == 4  # type: ignore[arg-type]
    assert resolve_attempt(True) == 4
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "SMON_ATTEMPT='second'" in messages and "SMON_ATTEMPT=-1" in messages
    assert "attempt=-2" in messages and "attempt='3'" in messages


def test_attempt_travels_with_every_batch(ingest, attach_fast, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    mon = attach_fast(server=ingest.address)
    mon.step()
    mon.close()
    batches = ingest.servicer.snapshot()
    assert batches and all(b.coords.HasField("attempt") and b.coords.attempt == 3 for b in batches)


def test_no_attempt_leaves_the_field_unset(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    mon.step()
    mon.close()
    batches = ingest.servicer.snapshot()
    assert batches and not any(b.coords.HasField("attempt") for b in batches)


def _older_batch_class() -> Any:
    """smon.v1.Batch as a reader built before Coordinates.attempt existed sees it: the same
    .proto without the field, in a descriptor pool of its own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    from smon.v1 import ingest_pb2 as pb

    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    coords = next(m for m in proto.message_type if m.name == "Coordinates")
    kept = [f for f in coords.field if f.name != "attempt"]
    del coords.field[:]
    coords.field.extend(kept)
    del coords.oneof_decl[:]  # proto3 `optional` adds a synthetic oneof for the field
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("smon.v1.Batch"))


def test_the_attempt_keeps_the_wire_compatible_both_ways():
    from smon.v1 import ingest_pb2 as pb

    older = _older_batch_class()
    new = pb.Batch(agent_id="a", seq=1, coords=pb.Coordinates(job="j", rank=3, world_size=4, attempt=2))
    new.steps.add(step=7, start_time=1.0, end_time=2.0, duration=1.0)
    seen_by_old = older.FromString(new.SerializeToString())  # an older server reads a newer agent
    assert (seen_by_old.coords.job, seen_by_old.coords.rank, seen_by_old.steps[0].step) == ("j", 3, 7)
    assert not hasattr(seen_by_old.coords, "attempt")
    from_old = older(agent_id="b", seq=1)
    from_old.coords.job, from_old.coords.rank, from_old.coords.world_size = "j", 1, 4
    seen_by_new = pb.Batch.FromString(from_old.SerializeToString())  # a newer server, an older agent
    assert seen_by_new.coords.job == "j" and not seen_by_new.coords.HasField("attempt")


def test_smon_host_names_the_host_an_agent_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from smon.coords import process_identity

    monkeypatch.delenv("SMON_HOST", raising=False)
    assert process_identity().host == socket.gethostname()
    monkeypatch.setenv("SMON_HOST", " node-17 ")
    assert process_identity().host == "node-17"
    monkeypatch.setenv("SMON_HOST", "")  # empty: as if unset
    assert process_identity().host == socket.gethostname()
