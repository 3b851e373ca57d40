"""Write validated batches, many in one transaction (group commit): a batch is acked only after
the transaction holding it commits.

The (agent_id, seq) rows are inserted first; a batch whose row already exists is a resend and
nothing else of it is written. Each batch goes to its agent's job attempt (store/attempts.py).
Each job attempt and each agent in the group is upserted once, in key order (so two writers never
wait on each other in opposite orders). Step records are keyed by (job attempt, step, rank,
start); their spans are packed (store/codec.py) with kind names turned into their job attempt's
codes (store/kinds.py: a name past the job's limit is stored as `other` and counted on the job).
On PostgreSQL all the group's step records go in with one COPY straight
into the table; if a record was already stored by some other route, that COPY fails on the key and
the group's records are copied again through a staging table with ON CONFLICT DO NOTHING, so each
record is still stored once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise, repeat
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import and_, bindparam, case, func, insert, literal_column, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from smon_server.store import attempts, codec, copy_binary, ledger
from smon_server.store.db import Database, Transaction
from smon_server.store.kinds import MAX_CODE, Resolved
from smon_server.store.models import Agent, Base, GpuSample, IngestedBatch, IngestedFloor, Job, StepRecord
from smon_server.store.rows import Rejection, StepBlock, ValidBatch

_JSON_COLUMNS = {"xid_events"}
TOO_MANY_KINDS = "too_many_kinds"
STEP_COLUMNS = [c.name for c in StepRecord.__table__.columns]
# The order `_step_rows` makes rows in and store/copy_binary.py writes them (checked here, once).
assert STEP_COLUMNS == [
    "job_key", "step", "rank", "start_time", "duration", "agent_key",
    "gc_count", "gc_seconds", "spans", "seq_total", "seq_microbatches", "span_host",
], STEP_COLUMNS  # fmt: skip


@dataclass(frozen=True)
class WriteResult:
    duplicate: bool
    # The batch as stored: records whose span kinds could get no code (their job's dictionary
    # has no code left) moved from its steps to its rejections, so the Ack and the counts say so.
    stored: ValidBatch
    # A duplicate whose records differ from those stored under its (agent_id, seq): not a resend
    # but a reused seq (an agent bug, or two agents with one id). Nothing of it was stored.
    conflict: bool = False
    # Spans stored as `other` because their phase name came past the job's SMON_MAX_PHASE_NAMES.
    folded_spans: int = 0


JobCodes = dict[int, Resolved]  # job attempt key -> codes of the group's names for that job


def write_batches(
    db: Database,
    batches: Sequence[ValidBatch],
    now: float,
    *,
    stall_seconds: float = attempts.DEFAULT_STALL_SECONDS,
    transaction: Transaction | None = None,
) -> list[WriteResult]:
    """Store `batches` in one transaction (`transaction`, or one from the pool); one result per
    batch, in order. `stall_seconds`: how long an agent may be silent and still count as alive (a
    new agent after that is a new run)."""
    transaction = transaction or db.transaction
    placed: dict[str, int] = {}
    keys: tuple[dict[tuple[str, int], int], dict[str, int]] | None = None
    codes: JobCodes = {}
    folded: dict[tuple[str, int], int] = {}
    with transaction() as session:
        dialect = session.get_bind().dialect.name
        digests = [b.digest for b in batches]
        fresh, conflicts = _claim_batches(session, dialect, batches, digests, now)
        stored = [b for i, b in enumerate(batches) if i in fresh]
        if stored:
            placed = attempts.assign(session, stored, now=now, stall_seconds=stall_seconds, known=db.attempts)
            known = db.row_keys.lookup(stored) if dialect == "postgresql" else None
            cached = _cached_codes(db, stored, known[0]) if known is not None else None
            if known is None or cached is None:
                # New jobs, agents or span kinds: the job rows first (a new job's key goes into
                # its records and kinds; its locked row serialises kind codes, store/kinds.py).
                keys = (
                    _upsert_jobs(session, dialect, stored, now),
                    _upsert_agents(session, dialect, stored, now),
                )
                codes = _resolve_codes(session, db, stored, keys[0])
                stored = [_refuse_unnamed_kinds(b, codes[keys[0][(b.job_id, b.attempt)]]) for b in stored]
                _insert_records(session, dialect, stored, keys, codes)
            else:
                # Records first, the rows other writers of these jobs lock last (store/row_keys.py).
                codes = cached
                _insert_records(session, dialect, stored, known, codes)
                keys = (
                    _upsert_jobs(session, dialect, stored, now),
                    _upsert_agents(session, dialect, stored, now),
                )
                db.row_keys.check(known, keys)
            folded = _count_folds(session, stored, keys[0], codes)
    db.attempts.remember(placed)  # committed: every process may now rely on these
    if keys is not None:
        db.row_keys.remember(*keys)
        db.kinds.remember({k: r.learned for k, r in codes.items() if r.learned is not None})
    stored_as = {(b.agent_id, b.seq): b for b in stored}
    return [
        WriteResult(
            duplicate=i not in fresh,
            stored=stored_as.get((b.agent_id, b.seq), b) if i in fresh else b,
            conflict=i in conflicts,
            folded_spans=folded.get((b.agent_id, b.seq), 0) if i in fresh else 0,
        )
        for i, b in enumerate(batches)
    ]


def _cached_codes(
    db: Database, batches: Sequence[ValidBatch], job_keys: Mapping[tuple[str, int], int]
) -> JobCodes | None:
    """Every job's codes for its batches' names from the process cache, or None if any misses."""
    names: dict[int, set[str]] = {}
    for b in batches:
        names.setdefault(job_keys[(b.job_id, b.attempt)], set()).update(b.steps.kind_names)
    out: JobCodes = {}
    for job_key, wanted in names.items():
        found = db.kinds.cached(job_key, wanted)
        if found is None:
            return None
        out[job_key] = found
    return out


def _resolve_codes(
    session: Session, db: Database, batches: Sequence[ValidBatch], job_keys: Mapping[tuple[str, int], int]
) -> JobCodes:
    """Every job's codes for its batches' names, new names added (the job rows are locked)."""
    names: dict[int, list[str]] = {}
    for b in batches:
        names.setdefault(job_keys[(b.job_id, b.attempt)], []).extend(b.steps.kind_names)
    out: JobCodes = {}
    for job_key in sorted(names):
        wanted = names[job_key]
        out[job_key] = db.kinds.cached(job_key, wanted) or db.kinds.resolve(session, job_key, wanted)
    return out


def _count_folds(
    session: Session, batches: Sequence[ValidBatch], job_keys: Mapping[tuple[str, int], int], codes: JobCodes
) -> dict[tuple[str, int], int]:
    """Spans folded into `other` per batch ((agent_id, seq)), added to their jobs' counts."""
    per_batch: dict[tuple[str, int], int] = {}
    per_job: dict[int, tuple[int, str]] = {}
    for b in batches:
        job_key = job_keys[(b.job_id, b.attempt)]
        folded = codes[job_key].folded
        if not folded or not len(b.steps):
            continue
        which = [i for i, name in enumerate(b.steps.kind_names) if name in folded]
        count = int(np.isin(b.steps.span_kind, which).sum())
        if count:
            per_batch[(b.agent_id, b.seq)] = count
            spans, example = per_job.get(job_key, (0, b.steps.kind_names[which[0]]))
            per_job[job_key] = (spans + count, example)
    for job_key, (spans, example) in sorted(per_job.items()):
        session.execute(
            update(Job)
            .where(Job.key == job_key)
            .values(
                folded_spans=Job.folded_spans + spans,
                folded_example=case((Job.folded_example == "", example[:128]), else_=Job.folded_example),
            )
        )
    return per_batch


def _insert_records(
    session: Session,
    dialect: str,
    stored: Sequence[ValidBatch],
    keys: tuple[Mapping[tuple[str, int], int], Mapping[str, int]],
    codes: JobCodes,
) -> None:
    """The batches' step records and GPU samples, with their job attempt and agent keys."""
    job_keys, agent_keys = keys
    with_steps = [
        (b, job_keys[(b.job_id, b.attempt)], agent_keys[b.agent_id]) for b in stored if len(b.steps)
    ]
    if with_steps:
        _insert_steps(session, dialect, with_steps, codes)
    samples = [row for b in stored for row in b.gpu_samples]
    if samples:
        _insert_ignoring_conflicts(session, dialect, GpuSample, samples)


def _refuse_unnamed_kinds(batch: ValidBatch, resolved: Resolved) -> ValidBatch:
    block = batch.steps
    codes = resolved.codes
    unnamed = [i for i, name in enumerate(block.kind_names) if name not in codes]
    if not unnamed:
        return batch
    lacking = (
        np.bincount(
            np.repeat(np.arange(len(block)), np.diff(block.span_offsets))[np.isin(block.span_kind, unnamed)],
            minlength=len(block),
        )
        > 0
    )
    refused = [
        Rejection(
            kind="step",
            index=-1,
            reason=TOO_MANY_KINDS,
            detail=f"step {step}: the job's span kind dictionary has no code left ({MAX_CODE})",
        )
        for step in block.step[lacking].tolist()
    ]
    return replace(batch, steps=block.take(~lacking), rejections=[*batch.rejections, *refused])


def _step_rows(batch: ValidBatch, codes: JobCodes, job_key: int, agent_key: int) -> Iterator[tuple[Any, ...]]:
    """The batch's records as rows in STEP_COLUMNS order."""
    block: StepBlock = batch.steps
    if not len(block):
        return iter(())
    packed = _packed_spans(block, codes[job_key].codes)
    edges = (block.span_offsets * codec.SPAN.itemsize).tolist()
    spans = [packed[a:b] for a, b in pairwise(edges)]
    return zip(
        repeat(job_key),
        block.step.tolist(),
        repeat(batch.coords.rank),
        block.start_time.tolist(),
        block.duration.tolist(),
        repeat(agent_key),
        block.gc_count.tolist(),
        block.gc_seconds.tolist(),
        spans,
        block.seq_total,
        block.seq_microbatches,
        block.span_host,
    )


def _packed_spans(block: StepBlock, codes: dict[str, int]) -> bytes:
    """Every record's spans back to back, kinds as their stored codes (store/codec.py)."""
    code_of = np.array([codes.get(name, 0) for name in block.kind_names] or [0], dtype=np.int64)
    return codec.pack_span_columns(
        code_of[block.span_kind],
        block.span_microbatch,
        block.span_chunk,
        block.span_start,
        block.span_duration,
    )


def _next_key(model: type[Job] | type[Agent]) -> Any:
    """SQLite has no identity columns: the next key, safe since SQLite serialises writers."""
    return select(func.coalesce(func.max(model.key), 0) + 1).scalar_subquery()


def _dialect_insert(dialect: str, table: Any) -> Any:
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def _greatest(dialect: str, a: Any, b: Any, *, least: bool = False) -> Any:
    """The larger (or, with `least`, the smaller) of two values, NULL counting as absent."""
    name = ("least" if least else "greatest") if dialect == "postgresql" else ("min" if least else "max")
    return getattr(func, name)(func.coalesce(a, b), func.coalesce(b, a))


def _claim_batches(
    session: Session, dialect: str, batches: Sequence[ValidBatch], digests: Sequence[int], now: float
) -> tuple[set[int], set[int]]:
    """(indexes of the batches stored for the first time, indexes of the repeats whose records
    differ from the first's). A repeat within the group is a resend too."""
    first: dict[tuple[str, int], int] = {}
    for i, b in enumerate(batches):
        first.setdefault((b.agent_id, b.seq), i)
    values = [
        {
            "agent_id": b.agent_id,
            "seq": b.seq,
            "job_id": b.job_id,
            "received_at": now,
            "accepted": b.accepted,
            "rejected": len(b.rejections),
            "digest": digests[i],
        }
        for i, b in ((i, batches[i]) for i in first.values())
    ]
    fresh: set[int] = set()
    if dialect == "postgresql":
        params = {column: [v[column] for v in values] for column in _CLAIM_COLUMNS}
        claimed = session.connection().exec_driver_sql(_claim_sql(), params).all()
        fresh = {first[(agent_id, seq)] for agent_id, seq in claimed}
    else:
        stmt = _dialect_insert(dialect, IngestedBatch).on_conflict_do_nothing()
        pruned = ledger.below_floor(session, list(first))
        for key, value in zip(first, values, strict=True):
            if key in pruned:
                continue
            if session.execute(stmt.values(value).returning(IngestedBatch.seq)).first() is not None:
                fresh.add(first[key])
    # What each (agent_id, seq) was first stored with: this group's first copy, or the database's.
    stored_digest: dict[tuple[str, int], int | None] = {
        key: digests[i] for key, i in first.items() if i in fresh
    }
    resent = [key for key, i in first.items() if i not in fresh]
    if resent:
        rows = session.execute(
            select(IngestedBatch.agent_id, IngestedBatch.seq, IngestedBatch.digest).where(
                or_(*(and_(IngestedBatch.agent_id == a, IngestedBatch.seq == q) for a, q in resent))
            )
        ).all()
        stored_digest.update({(a, q): d for a, q, d in rows})
    conflicts = {
        i
        for i, b in enumerate(batches)
        if i not in fresh and stored_digest.get((b.agent_id, b.seq)) not in (None, digests[i])
    }
    return fresh, conflicts


_CLAIM_COLUMNS = ("agent_id", "seq", "job_id", "received_at", "accepted", "rejected", "digest")


def _above_floor(rows: Any) -> Any:
    """Not at or below its agent's floor: a batch whose ledger row was pruned (store/ledger.py)."""
    return ~(
        select(IngestedFloor.agent_id)
        .where(IngestedFloor.agent_id == rows.c.agent_id, IngestedFloor.seq >= rows.c.seq)
        .exists()
    )


@functools.cache
def _claim_sql() -> str:
    return _postgres_sql(
        _bulk_insert(IngestedBatch, _CLAIM_COLUMNS, where=_above_floor)
        .on_conflict_do_nothing()
        .returning(IngestedBatch.agent_id, IngestedBatch.seq)
    )


def _postgres_sql(statement: Any) -> str:
    """The statement's SQL for psycopg, compiled once: the ingest writer runs a handful of them
    dozens of times a second, and SQLAlchemy's per-execution cache lookup (a cache key built from
    the statement's whole tree) cost more than the statement's own round trip."""
    compiled = statement.compile(dialect=postgresql.psycopg.dialect())
    assert set(compiled.params) <= {c.name for c in statement.table.columns}, compiled.params  # no literals
    return str(compiled)


def _bulk_insert(model: Any, columns: Sequence[str], where: Callable[[Any], Any] | None = None) -> Any:
    """PostgreSQL `INSERT … SELECT … FROM unnest(one array per column)`: the same statement text
    for any number of rows, sent with one array per column. (A multi-row VALUES list is new SQL
    for every row count, which psycopg re-parses and PostgreSQL re-plans on each group.)
    `where(rows)`: a condition on the unnested rows, to insert only those meeting it."""
    table = model.__table__
    arrays = [bindparam(column, type_=ARRAY(table.c[column].type)) for column in columns]
    rows = func.unnest(*arrays).table_valued(*columns).render_derived()
    chosen = select(*(rows.c[c] for c in columns))
    if where is not None:
        chosen = chosen.where(where(rows))
    return postgresql.insert(model).from_select(list(columns), chosen)


def _by(batches: Iterable[ValidBatch], key: Callable[[ValidBatch], Any]) -> dict[Any, list[ValidBatch]]:
    """Batches grouped by `key` ((job_id, attempt) or agent_id), keys sorted: rows are locked in
    that order."""
    out: dict[Any, list[ValidBatch]] = {}
    for b in batches:
        out.setdefault(key(b), []).append(b)
    return dict(sorted(out.items()))


def _upsert_rows(
    session: Session, dialect: str, model: Any, rows: list[dict[str, Any]], upsert: Any
) -> dict[Any, int]:
    """Upsert `rows` (one per natural key, each with the same keys) and return natural key ->
    integer key: on PostgreSQL one statement over arrays; SQLite assigns keys itself
    (`_next_key`), so one row at a time. A job's natural key is (job_id, attempt), an agent's
    its agent_id."""
    names = (model.job_id, model.attempt) if model is Job else (model.agent_id,)
    stmt = upsert.returning(*names, model.key)

    def natural(row: Any) -> Any:
        return (str(row[0]), int(row[1])) if model is Job else str(row[0])

    if dialect == "postgresql":
        params = {column: [row[column] for row in rows] for column in rows[0]}
        result = session.connection().exec_driver_sql(_upsert_sql(model.__tablename__), params)
        return {natural(r): int(r[-1]) for r in result.all()}
    out = {}
    for row in rows:
        stored = session.execute(stmt.values({**row, "key": _next_key(model)})).one()
        out[natural(stored)] = int(stored[-1])
    return out


def _upsert_jobs(
    session: Session, dialect: str, batches: Sequence[ValidBatch], now: float
) -> dict[tuple[str, int], int]:
    rows = []
    for (job_id, attempt), group in _by(batches, lambda b: (b.job_id, b.attempt)).items():
        with_steps = [b for b in group if len(b.steps)]
        rows.append(
            {
                "job_id": job_id,
                "attempt": attempt,
                "reported_attempt": attempts.reported_attempt(group),
                "world_size": max(b.coords.world_size for b in group),
                "dp_size": max(b.coords.dp_size or b.coords.world_size for b in group),
                "pp_size": max(b.coords.pp_size or 1 for b in group),
                "tp_size": max(b.coords.tp_size or 1 for b in group),
                "first_seen": now,
                "last_seen": now,
                "last_step": max((int(b.steps.step.max()) for b in with_steps), default=None),
                "last_step_seen": now if with_steps else None,
                "step_writes": 1 if with_steps else 0,
                "gpu_hours_wasted": 0.0,
            }
        )

    return _upsert_rows(session, dialect, Job, rows, _job_upsert(dialect))


@functools.cache
def _upsert_sql(table: str) -> str:
    if table == Job.__tablename__:
        return _postgres_sql(_job_upsert("postgresql").returning(Job.job_id, Job.attempt, Job.key))
    return _postgres_sql(_agent_upsert("postgresql").returning(Agent.agent_id, Agent.key))


_JOB_COLUMNS = (
    "job_id", "attempt", "reported_attempt", "world_size", "dp_size", "pp_size", "tp_size",
    "first_seen", "last_seen", "last_step", "last_step_seen", "step_writes", "gpu_hours_wasted",
)  # fmt: skip


@functools.cache
def _job_upsert(dialect: str) -> Any:
    """Built once per dialect: building it took longer than running it for a group."""
    stmt = _bulk_insert(Job, _JOB_COLUMNS) if dialect == "postgresql" else _dialect_insert(dialect, Job)
    excluded = stmt.excluded
    update: dict[str, Any] = {
        "last_seen": _greatest(dialect, Job.last_seen, excluded.last_seen),
        "world_size": _greatest(dialect, Job.world_size, excluded.world_size),
        "dp_size": _greatest(dialect, Job.dp_size, excluded.dp_size),
        "pp_size": _greatest(dialect, Job.pp_size, excluded.pp_size),
        "tp_size": _greatest(dialect, Job.tp_size, excluded.tp_size),
        "last_step": _greatest(dialect, Job.last_step, excluded.last_step),
        "last_step_seen": _greatest(dialect, Job.last_step_seen, excluded.last_step_seen),
        "step_writes": Job.step_writes + excluded.step_writes,
        "reported_attempt": _greatest(dialect, Job.reported_attempt, excluded.reported_attempt),
    }
    return stmt.on_conflict_do_update(index_elements=[Job.job_id, Job.attempt], set_=update)


def _upsert_agents(
    session: Session, dialect: str, batches: Sequence[ValidBatch], now: float
) -> dict[str, int]:
    rows = []
    for agent_id, group in _by(batches, lambda b: b.agent_id).items():
        latest = max(group, key=lambda b: b.seq)
        coords = latest.coords
        counters = [b.counters for b in group if b.counters is not None]
        heartbeats = [(b.heartbeat, b.clock_offset) for b in group if b.heartbeat is not None]
        first_steps = [int(b.steps.step.min()) for b in group if len(b.steps)]
        row: dict[str, Any] = {
            "agent_id": agent_id,
            "job_id": latest.job_id,
            "attempt": latest.attempt,
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
            "clock_offset": latest.clock_offset,
            "first_seen": now,
            "last_seen": now,
            "dropped_records": max((c.dropped_records for c in counters), default=0),
            "errors": max((c.errors for c in counters), default=0),
            "final": any(b.final for b in group),
            "first_step": min(first_steps, default=None),
            "hb_time": None,
            "hb_last_step": None,
            "hb_current_step": None,
            "hb_phase": "",
            "hb_phase_since": None,
        }
        if heartbeats:
            hb, offset = max(heartbeats, key=lambda h: h[0].time)
            row.update(
                hb_time=hb.time + offset,
                hb_last_step=hb.last_step,
                hb_current_step=hb.current_step,
                hb_phase=hb.phase,
                hb_phase_since=(hb.phase_since + offset) if hb.phase_since else None,
            )
        rows.append(row)

    return _upsert_rows(session, dialect, Agent, rows, _agent_upsert(dialect))


_AGENT_COLUMNS = (
    "agent_id", "job_id", "attempt", "rank", "local_rank", "host", "gpu_uuid", "dp_rank", "pp_rank",
    "tp_rank", "pid", "agent_version", "backend", "clock_offset", "first_seen", "last_seen",
    "dropped_records", "errors", "final", "first_step", "hb_time", "hb_last_step", "hb_current_step",
    "hb_phase", "hb_phase_since",
)  # fmt: skip


@functools.cache
def _agent_upsert(dialect: str) -> Any:
    stmt = _bulk_insert(Agent, _AGENT_COLUMNS) if dialect == "postgresql" else _dialect_insert(dialect, Agent)
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
        "final": Agent.final | excluded.final,
    }
    # Only a newer heartbeat replaces the stored one (batches may arrive out of order).
    newer = excluded.hb_time.is_not(None) & (
        func.coalesce(Agent.hb_time, literal_column("0.0")) <= excluded.hb_time
    )
    for column in ("hb_time", "hb_last_step", "hb_current_step", "hb_phase", "hb_phase_since"):
        update[column] = case((newer, getattr(excluded, column)), else_=getattr(Agent, column))
    return stmt.on_conflict_do_update(index_elements=[Agent.agent_id], set_=update)


def _insert_steps(
    session: Session, dialect: str, batches: list[tuple[ValidBatch, int, int]], codes: JobCodes
) -> None:
    """The batches' step records, with their (job key, agent key)."""

    def rows() -> list[tuple[Any, ...]]:
        return [row for b, job_key, agent_key in batches for row in _step_rows(b, codes, job_key, agent_key)]

    if dialect != "postgresql":
        session.execute(
            insert(StepRecord).prefix_with("OR IGNORE"),
            [dict(zip(STEP_COLUMNS, r, strict=True)) for r in rows()],
        )
        return
    driver = session.connection().connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    column_list = ", ".join(STEP_COLUMNS)
    try:
        # psycopg makes this a savepoint inside the session's transaction: a key conflict undoes
        # the COPY alone.
        with (
            driver.transaction(),
            driver.cursor().copy(f"COPY step_records ({column_list}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.write(copy_binary.HEADER + _binary_rows(batches, codes) + copy_binary.TRAILER)
    except psycopg.errors.UniqueViolation:
        _copy_insert(session, "step_records", STEP_COLUMNS, rows())


def _binary_rows(batches: list[tuple[ValidBatch, int, int]], codes: JobCodes) -> bytes:
    """Every record of the group as binary COPY rows, built in one go (store/copy_binary.py)."""
    blocks = [b.steps for b, _, _ in batches]
    sizes = [len(block) for block in blocks]

    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(block, name) for block in blocks])

    return copy_binary.step_rows(
        job_key=np.repeat([job_key for _, job_key, _ in batches], sizes),
        agent_key=np.repeat([agent_key for _, _, agent_key in batches], sizes),
        rank=np.repeat([b.coords.rank for b, _, _ in batches], sizes),
        step=joined("step"),
        start_time=joined("start_time"),
        duration=joined("duration"),
        gc_count=joined("gc_count"),
        gc_seconds=joined("gc_seconds"),
        spans=b"".join(_packed_spans(b.steps, codes[job_key].codes) for b, job_key, _ in batches),
        span_bytes=np.concatenate([np.diff(block.span_offsets) for block in blocks]) * codec.SPAN.itemsize,
        seq_total=[v for block in blocks for v in block.seq_total],
        seq_microbatches=[v for block in blocks for v in block.seq_microbatches],
        span_host=[v for block in blocks for v in block.span_host],
    )


def _insert_ignoring_conflicts(
    session: Session, dialect: str, model: type[Base], rows: list[dict[str, Any]]
) -> None:
    if dialect == "postgresql":
        columns = [c.name for c in model.__table__.columns]
        values = [tuple(json.dumps(r[c]) if c in _JSON_COLUMNS else r[c] for c in columns) for r in rows]
        _copy_insert(session, model.__tablename__, columns, values)
        return
    session.execute(insert(model).prefix_with("OR IGNORE"), rows)


def _copy_insert(session: Session, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
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
            copy.write_row(row)
    session.execute(
        text(
            f"INSERT INTO {table} ({column_list}) SELECT {column_list} FROM {staging} ON CONFLICT DO NOTHING"
        )
    )
