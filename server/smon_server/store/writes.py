"""Write one validated batch in one transaction: a batch is acked only after this commits.

The (agent_id, seq) row is inserted first; if it already exists the batch is a resend and nothing
else is written. Step records are keyed by (job, step, rank, start) and inserted with ON CONFLICT
DO NOTHING, so a record that reaches the server twice by any route is stored once. Their spans are
packed (store/codec.py) with kind names turned into codes first (store/kinds.py). On PostgreSQL
the rows go in with COPY into a temporary table, then one INSERT … SELECT … ON CONFLICT.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import case, func, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from smon.v1 import ingest_pb2 as pb
from smon_server.store import codec
from smon_server.store.codec import MAX_KINDS
from smon_server.store.db import Database
from smon_server.store.models import Agent, Base, GpuSample, IngestedBatch, Job, StepRecord
from smon_server.store.rows import ValidBatch

_JSON_COLUMNS = {"xid_events"}
TOO_MANY_KINDS = "too_many_kinds"


@dataclass(frozen=True)
class WriteResult:
    duplicate: bool
    # The batch as stored: records whose span kinds could get no code (the kind dictionary is
    # full) moved from its steps to its rejections, so the Ack and the counts say so.
    stored: ValidBatch


def write_batch(db: Database, batch: ValidBatch, now: float) -> WriteResult:
    codes = db.kinds.codes(db.transaction, {span[0] for row in batch.steps for span in row["spans"]})
    batch = _refuse_unnamed_kinds(batch, codes)
    with db.transaction() as session:
        dialect = session.get_bind().dialect.name
        if not _claim_batch(session, dialect, batch, now):
            return WriteResult(duplicate=True, stored=batch)
        job_key = _upsert_job(session, dialect, batch, now)
        agent_key = _upsert_agent(session, dialect, batch, now)
        if batch.steps:
            rows = [_step_record(row, codes, job_key, agent_key) for row in batch.steps]
            _insert_ignoring_conflicts(session, dialect, StepRecord, rows)
        if batch.gpu_samples:
            _insert_ignoring_conflicts(session, dialect, GpuSample, batch.gpu_samples)
    return WriteResult(duplicate=False, stored=batch)


def _refuse_unnamed_kinds(batch: ValidBatch, codes: dict[str, int]) -> ValidBatch:
    kept = [row for row in batch.steps if all(span[0] in codes for span in row["spans"])]
    if len(kept) == len(batch.steps):
        return batch
    refused = [
        pb.Rejection(
            kind="step",
            index=-1,
            reason=TOO_MANY_KINDS,
            detail=f"step {row['step']}: span kind dictionary full ({MAX_KINDS} names)",
        )
        for row in batch.steps
        if not all(span[0] in codes for span in row["spans"])
    ]
    return replace(batch, steps=kept, rejections=[*batch.rejections, *refused])


def _step_record(row: dict[str, Any], codes: dict[str, int], job_key: int, agent_key: int) -> dict[str, Any]:
    return {
        "job_key": job_key,
        "step": row["step"],
        "rank": row["rank"],
        "start_time": row["start_time"],
        "duration": row["duration"],
        "agent_key": agent_key,
        "gc_count": row["gc_count"],
        "gc_seconds": row["gc_seconds"],
        "spans": codec.pack_spans([(codes[k], a, d, mb, ch) for k, a, d, mb, ch in row["spans"]]),
        "seq_total": codec.pack_seq_total(row["seq_total"]),
        "seq_microbatches": codec.pack_seq_microbatches(row["seq_microbatches"]),
    }


def _next_key(model: type[Job] | type[Agent]) -> Any:
    """SQLite has no identity columns: the next key, safe since SQLite serialises writers."""
    return select(func.coalesce(func.max(model.key), 0) + 1).scalar_subquery()


def _dialect_insert(dialect: str, table: Any) -> Any:
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def _greatest(dialect: str, a: Any, b: Any, *, least: bool = False) -> Any:
    """The larger (or, with `least`, the smaller) of two values, NULL counting as absent."""
    name = ("least" if least else "greatest") if dialect == "postgresql" else ("min" if least else "max")
    return getattr(func, name)(func.coalesce(a, b), func.coalesce(b, a))


def _claim_batch(session: Session, dialect: str, batch: ValidBatch, now: float) -> bool:
    stmt = (
        _dialect_insert(dialect, IngestedBatch)
        .values(
            agent_id=batch.agent_id,
            seq=batch.seq,
            job_id=batch.job_id,
            received_at=now,
            accepted=batch.accepted,
            rejected=len(batch.rejections),
        )
        .on_conflict_do_nothing()
        .returning(IngestedBatch.seq)
    )
    return session.execute(stmt).first() is not None


def _upsert_job(session: Session, dialect: str, batch: ValidBatch, now: float) -> int:
    coords = batch.coords
    last_step = max((row["step"] for row in batch.steps), default=None)
    values: dict[str, Any] = {
        "job_id": batch.job_id,
        "world_size": coords.world_size,
        "dp_size": coords.dp_size or coords.world_size,
        "pp_size": coords.pp_size or 1,
        "tp_size": coords.tp_size or 1,
        "first_seen": now,
        "last_seen": now,
        "last_step": last_step,
        "last_step_seen": now if batch.steps else None,
        "gpu_hours_wasted": 0.0,
    }
    if dialect != "postgresql":
        values["key"] = _next_key(Job)
    stmt = _dialect_insert(dialect, Job).values(**values)
    excluded = stmt.excluded
    update: dict[str, Any] = {
        "last_seen": _greatest(dialect, Job.last_seen, excluded.last_seen),
        "world_size": _greatest(dialect, Job.world_size, excluded.world_size),
        "dp_size": _greatest(dialect, Job.dp_size, excluded.dp_size),
        "pp_size": _greatest(dialect, Job.pp_size, excluded.pp_size),
        "tp_size": _greatest(dialect, Job.tp_size, excluded.tp_size),
        "last_step": _greatest(dialect, Job.last_step, excluded.last_step),
    }
    if batch.steps:
        update["last_step_seen"] = _greatest(dialect, Job.last_step_seen, excluded.last_step_seen)
    upsert = stmt.on_conflict_do_update(index_elements=[Job.job_id], set_=update).returning(Job.key)
    return int(session.execute(upsert).scalar_one())


def _upsert_agent(session: Session, dialect: str, batch: ValidBatch, now: float) -> int:
    coords = batch.coords
    values: dict[str, Any] = {
        "agent_id": batch.agent_id,
        "job_id": batch.job_id,
        "rank": coords.rank,
        "local_rank": coords.local_rank,
        "host": coords.host,
        "gpu_uuid": coords.gpu_uuid,
        "dp_rank": coords.dp_rank,
        "pp_rank": coords.pp_rank,
        "tp_rank": coords.tp_rank,
        "pid": coords.pid,
        "agent_version": coords.agent_version,
        "backend": coords.backend[:32],
        "clock_offset": batch.clock_offset,
        "first_seen": now,
        "last_seen": now,
        "dropped_records": batch.counters.dropped_records if batch.counters else 0,
        "errors": batch.counters.errors if batch.counters else 0,
        "final": batch.final,
        "first_step": min((row["step"] for row in batch.steps), default=None),
        "hb_phase": "",
    }
    if dialect != "postgresql":
        values["key"] = _next_key(Agent)
    hb = batch.heartbeat
    if hb is not None:
        values.update(
            hb_time=hb.time + batch.clock_offset,
            hb_last_step=hb.last_step,
            hb_current_step=hb.current_step,
            hb_phase=hb.phase,
            hb_phase_since=(hb.phase_since + batch.clock_offset) if hb.phase_since else None,
        )
    stmt = _dialect_insert(dialect, Agent).values(**values)
    excluded = stmt.excluded
    update: dict[str, Any] = {
        "last_seen": _greatest(dialect, Agent.last_seen, excluded.last_seen),
        "clock_offset": excluded.clock_offset,
        "host": excluded.host,
        "gpu_uuid": excluded.gpu_uuid,
        # Counters are cumulative on the agent; a resent older batch must not move them back.
        "dropped_records": _greatest(dialect, Agent.dropped_records, excluded.dropped_records),
        "errors": _greatest(dialect, Agent.errors, excluded.errors),
        "first_step": _greatest(dialect, Agent.first_step, excluded.first_step, least=True),
    }
    if batch.final:
        update["final"] = excluded.final
    if hb is not None:
        # Only a newer heartbeat replaces the stored one (batches may arrive out of order).
        newer = func.coalesce(Agent.hb_time, 0.0) <= excluded.hb_time
        for column in ("hb_time", "hb_last_step", "hb_current_step", "hb_phase", "hb_phase_since"):
            current = getattr(Agent, column)
            update[column] = case((newer, getattr(excluded, column)), else_=current)
    upsert = stmt.on_conflict_do_update(index_elements=[Agent.agent_id], set_=update).returning(Agent.key)
    return int(session.execute(upsert).scalar_one())


def _insert_ignoring_conflicts(
    session: Session, dialect: str, model: type[Base], rows: list[dict[str, Any]]
) -> None:
    if dialect == "postgresql":
        columns = [c.name for c in model.__table__.columns]
        _copy_insert(session, model.__tablename__, columns, rows)
        return
    session.execute(insert(model).prefix_with("OR IGNORE"), rows)


def _copy_insert(session: Session, table: str, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    """COPY into a per-transaction temporary table, then move rows over, skipping conflicts."""
    staging = f"_in_{table}"
    session.execute(
        text(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} "
            f"(LIKE {table} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
    )
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    column_list = ", ".join(columns)
    with cursor.copy(f"COPY {staging} ({column_list}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([json.dumps(row[c]) if c in _JSON_COLUMNS else row[c] for c in columns])
    session.execute(
        text(
            f"INSERT INTO {table} ({column_list}) SELECT {column_list} FROM {staging} ON CONFLICT DO NOTHING"
        )
    )
