"""The wire protocol's per-batch messages as the store's row types, and the store's refusals back
as the Ack's messages: the store knows no protobuf (pyproject.toml's import contracts).

Only per-batch messages pass here (coordinates, heartbeat, counters) and refusals; step records
go to the store as columns (ingest/record_columns.py, ingest/validate.py), never one by one.
"""

from __future__ import annotations

from collections.abc import Iterable

from smon.v1 import ingest_pb2 as pb
from smon_server.store.rows import AgentCounters, Coordinates, Heartbeat, Rejection

_INT64_MAX = 2**63 - 1


def coordinates(coords: pb.Coordinates) -> Coordinates:
    return Coordinates(
        rank=coords.rank,
        world_size=coords.world_size,
        local_rank=coords.local_rank,
        host=coords.host,
        gpu_uuid=coords.gpu_uuid,
        dp_rank=coords.dp_rank,
        pp_rank=coords.pp_rank,
        tp_rank=coords.tp_rank,
        dp_size=coords.dp_size,
        pp_size=coords.pp_size,
        tp_size=coords.tp_size,
        pid=coords.pid,
        agent_version=coords.agent_version,
        backend=coords.backend,
        attempt=int(coords.attempt) if coords.HasField("attempt") else None,
    )


def heartbeat(hb: pb.Heartbeat) -> Heartbeat:
    return Heartbeat(
        time=hb.time,
        last_step=hb.last_step,
        current_step=hb.current_step,
        phase=hb.phase,
        phase_since=hb.phase_since,
    )


def counters(counters: pb.AgentCounters) -> AgentCounters:
    """Cumulative uint64 counters stored in signed 64-bit columns: past the column they stay at its
    maximum (a count that large is already "everything")."""
    return AgentCounters(
        dropped_records=min(counters.dropped_records, _INT64_MAX),
        errors=min(counters.errors, _INT64_MAX),
    )


def rejections(refused: Iterable[Rejection]) -> list[pb.Rejection]:
    """The Ack's rejections (one per refused record: none in a clean batch)."""
    return [pb.Rejection(kind=r.kind, index=r.index, reason=r.reason, detail=r.detail) for r in refused]
