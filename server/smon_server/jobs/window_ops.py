"""A job's analysis window as an op table, built incrementally from one pass to the next.

Reading a 4,096-rank × 500-step window and building its op table is most of a cold pass (tens of
seconds). From one pass to the next only the newest steps change, so the process that analyses a
job keeps the job's op table and, each pass, reads and builds only the steps after the newest one
it holds, merges them in (whatif/inputs/merge.py) and drops the steps that slid out of the window.

What may be kept: every step up to the newest *complete* step M (every worker reported it) is
settled. An agent ships its records in step order and resends unacked batches before newer ones,
so once every worker has reported M, a record of an earlier step that has not arrived never will
(it was dropped and counted by its agent). The cache is keyed by what would change a settled
step: the job's agents (a restarted rank re-runs steps under a new agent, and a new rank changes
which steps are complete) and its restarts. Anything else, and a cached table that no longer
reaches the window, means a cold build, which gives the same table.

Memory is bounded by SMON_ANALYSIS_CACHE_MB over all jobs; the least recently analysed go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from smon_server.columns import StepColumns, dense_index
from smon_server.store.models import Agent, Job, StepRecord
from smon_server.store.queries import newest_steps
from smon_server.store.step_window import read_window
from smon_server.whatif.inputs.from_steps import build_labelled_op_table, complete_steps
from smon_server.whatif.inputs.merge import HostLabels, drop_unused_types, join_tables, merge_tables
from smon_server.whatif.ops import OpTable

StepTimes = list[tuple[int, float, float]]
# Told of every read of records and its lower step bound (store/phase_grids.Collector.add).
OnRead = Callable[[StepColumns, int | None], None]


@dataclass
class WindowOps:
    """Ops of the complete steps from `lo` on, and each such step's wall-clock span."""

    ops: OpTable | None
    times: StepTimes  # (step, first start, last end), ascending
    incremental: bool  # built on a cached table (for tests and the benchmark)


@dataclass
class _Entry:
    key: Hashable
    ops: OpTable
    labels: HostLabels
    workers: np.ndarray  # sorted worker ids (dp_rank << 32 | stage) of the records read
    last_seen: np.ndarray  # per worker, the newest step it reported
    through: int  # newest step in `ops`: every step up to it is settled
    times: np.ndarray  # [steps, 3]: step, first start, last end
    # What the table would say had the skipped steps' ops been kept (so that trimming drops the
    # op types a full table would drop): the steps that have ops, and per op type its newest
    # step with an op (the minimum int64 for a type with none).
    row_steps: np.ndarray
    type_newest: np.ndarray

    @property
    def nbytes(self) -> int:
        columns = (getattr(self.ops, name) for name in OpTable.COLUMNS)
        return (
            sum(int(c.nbytes) for c in columns)
            + int(self.ops.host_duration.nbytes)
            + int(self.times.nbytes + self.row_steps.nbytes + self.type_newest.nbytes)
            + 16 * self.workers.size
        )


class WindowCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int], _Entry] = OrderedDict()  # by (job_id, attempt)
        self._lock = threading.Lock()

    def get(self, job: tuple[str, int], key: Hashable) -> _Entry | None:
        with self._lock:
            entry = self._entries.pop(job, None)
        return entry if entry is not None and entry.key == key else None

    def put(self, job: tuple[str, int], entry: _Entry) -> None:
        if entry.nbytes > self.max_bytes:
            return
        with self._lock:
            self._entries[job] = entry
            total = sum(e.nbytes for e in self._entries.values())
            while total > self.max_bytes and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                total -= evicted.nbytes

    def __len__(self) -> int:
        return len(self._entries)


def cache_key(database: str, job: Job, agents: Sequence[Agent], restarts: Sequence[int]) -> Hashable:
    """What a kept table depends on beyond its steps. The database is part of it: a process may
    serve more than one (tests do), and job and agent keys are only unique within one."""
    return (database, job.key, job.world_size, tuple(sorted(a.key for a in agents)), tuple(restarts))


def window_ops(
    *,
    session: Session,
    job: Job,
    lo: int | None,
    hi: int | None,
    key: Hashable,
    cache: WindowCache | None,
    on_read: OnRead | None = None,
    skip: Sequence[tuple[int, int]] = (),
) -> WindowOps:
    """The op table of the complete steps in [lo, hi] (from the cache where it can be), without
    the ops of steps in the `skip` ranges ([a, b): warm-up steps, which the analysis leaves out;
    each chunk drops them as it is built, rather than the whole table being copied without
    them); its op types are those of the table with them. `skip` must be the same for every
    pass under one `key`. `on_read` sees every batch of records read, so the pass can derive
    more from them without reading them again (the phase heatmaps)."""
    entry = cache.get((job.job_id, job.attempt), key) if cache is not None else None
    behind = entry is not None and (lo is None or entry.through < lo - 1)
    if behind or (entry is not None and hi is not None and hi < entry.through):
        entry = None  # the window jumped past what is kept, or looks back before it
    if entry is not None:
        entry = _extend(session, job, entry, hi, on_read, skip)
    if entry is not None and lo is not None and int(entry.last_seen.min()) < lo - 1:
        entry = None  # a worker left: the window's steps are complete without it
    incremental = entry is not None
    if entry is None:
        entry = _cold(session, job, lo, hi, key, on_read, skip)
    if entry is None:
        return WindowOps(None, [], incremental=False)
    if lo is not None:
        entry = _trim(entry, lo)
    if cache is not None:
        cache.put((job.job_id, job.attempt), entry)
    times = [(int(s), float(a), float(b)) for s, a, b in entry.times]
    ops = entry.ops if len(entry.ops) else None
    return WindowOps(ops, times, incremental=incremental)


# A cold build reads and builds the window this many steps at a time: the records of a whole
# 4,096-rank window decoded at once would take gigabytes, and on PostgreSQL the next chunk is read
# (by the database, in another process) while this one is built.
COLD_CHUNK_STEPS = 64
# A window of at most this many records (world size × steps) is read in one query: chunking a
# 64-rank × 500-step window cost eight queries and a join for nothing (0.24 -> 0.18 CPU s a cold
# pass). Bigger ones are quicker in chunks too (a 512-rank window read whole: 1.7 -> 2.0 s).
WHOLE_READ_RECORDS = 65_536


def _cold(
    session: Session,
    job: Job,
    lo: int | None,
    hi: int | None,
    key: Hashable,
    on_read: OnRead | None,
    skip: Sequence[tuple[int, int]],
) -> _Entry | None:
    # One step before the window: steps are cut at their last collective, and the window's
    # first step starts with the tail of the one before it (whatif/inputs/from_steps.py).
    small = lo is not None and hi is not None and max(job.world_size, 1) * (hi - lo + 2) <= WHOLE_READ_RECORDS
    if lo is None or hi is None or hi - lo < 2 * COLD_CHUNK_STEPS or small:
        first = lo - 1 if lo is not None else None
        records = read_window(session=session, job=job, from_step=first, to_step=hi)
        if on_read is not None:
            on_read(records, first)
        workers, last_seen = _workers(records)
        return _build(records, workers, last_seen, key, lo, skip)
    workers, last_seen = _window_workers(session, job, lo - 1, hi)
    if not workers.size:
        return None
    bounds = chunk_bounds(newest_steps(session=session, job=job, lo=lo - 1, hi=hi)[::-1], COLD_CHUNK_STEPS)
    if not bounds:
        return None
    pieces: list[_Entry] = []  # each chunk's new complete steps, joined once at the end
    carry: StepColumns | None = None  # records from the newest complete step on, for the next chunk
    for (a, _), records in zip(bounds, _read_chunks(session, job, bounds), strict=True):
        if on_read is not None:
            on_read(records, a)
        if carry is not None:
            records = StepColumns.concat([carry, records])
        if not pieces:
            piece = _build(records, workers, last_seen, key, lo, skip)
        else:
            through = pieces[-1].through
            seen, _ = _workers(records)
            complete = complete_steps(records, workers.size)
            if not np.isin(seen, workers).all() or int(complete.step.min(initial=through)) != through:
                # The records changed under the read (a new rank, a restart): read it whole.
                whole = read_window(session=session, job=job, from_step=lo - 1, to_step=hi)
                if on_read is not None:
                    on_read(whole, lo - 1)
                return _build(whole, *_workers(whole), key, lo, skip)
            newer = len(complete) and int(complete.step.max()) > through
            piece = _build(complete, workers, last_seen, key, through + 1, skip) if newer else None
        if piece is not None:
            pieces.append(piece)
        carry = records if not pieces else records.take(records.step >= pieces[-1].through)
    if not pieces:
        return None
    times = np.concatenate([p.times for p in pieces])
    row_steps = np.concatenate([p.row_steps for p in pieces])
    newest = [(p.ops.op_types, p.type_newest) for p in pieces]
    parts = [(p.ops, p.labels) for p in pieces]
    last = replace(pieces[-1], ops=pieces[0].ops.take(np.zeros(0, dtype=np.int64)))
    piece = None
    pieces.clear()  # the parts list is the only reference left: join_tables lets go as it joins
    ops, labels = join_tables(parts)
    return replace(
        last,
        ops=ops,
        labels=labels,
        times=times,
        row_steps=row_steps,
        type_newest=_newest_by_type(ops, newest),
    )


def chunk_bounds(steps: Sequence[int], size: int) -> list[tuple[int, int]]:
    """[first, last] step of each run of `size` of the ascending distinct `steps`: chunks by the
    steps that exist, not by step numbers (a job numbering its steps by samples, or a restored
    one, would make ranges of numbers that are almost all empty, or billions of them)."""
    return [(steps[i], steps[min(i + size, len(steps)) - 1]) for i in range(0, len(steps), size)]


def _newest_by_type(ops: OpTable, parts: list[tuple[tuple[str, ...], np.ndarray]]) -> np.ndarray:
    """`type_newest` of a table joined from parts, from the parts' own."""
    out = np.full(len(ops.op_types), np.iinfo(np.int64).min)
    for op_types, newest in parts:
        at = np.array([ops.op_types.index(name) for name in op_types], dtype=np.int64)
        if at.size:
            out[at] = np.maximum(out[at], newest)
    return out


def _read_chunks(session: Session, job: Job, bounds: list[tuple[int, int]]) -> Iterator[StepColumns]:
    """The records of each step range; on PostgreSQL, each read while the one before is used."""
    engine = session.get_bind()
    if engine.dialect.name != "postgresql":
        for a, b in bounds:
            yield read_window(session=session, job=job, from_step=a, to_step=b)
        return

    def read(a: int, b: int) -> StepColumns:
        with Session(engine) as own:
            return read_window(session=own, job=job, from_step=a, to_step=b)

    with ThreadPoolExecutor(1, thread_name_prefix="smon-window-read") as reader:
        pending = reader.submit(read, *bounds[0])
        for following in [*bounds[1:], None]:
            records = pending.result()
            if following is not None:
                pending = reader.submit(read, *following)
            yield records


def _window_workers(session: Session, job: Job, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """What _workers gives for the records of steps [lo, hi], from one aggregate query."""
    newest = dict(
        session.execute(
            select(StepRecord.agent_key, func.max(StepRecord.step))
            .where(StepRecord.job_key == job.key, StepRecord.step >= lo, StepRecord.step <= hi)
            .group_by(StepRecord.agent_key)
        ).all()
    )
    coords = {
        key: (int(dp) << 32) | int(pp)
        for key, dp, pp in session.execute(
            select(Agent.key, Agent.dp_rank, Agent.pp_rank).where(
                Agent.job_id == job.job_id, Agent.attempt == job.attempt
            )
        ).all()
    }
    last: dict[int, int] = {}
    for agent, step in newest.items():
        worker = coords.get(agent)
        if worker is not None:
            last[worker] = max(last.get(worker, int(step)), int(step))
    workers = np.array(sorted(last), dtype=np.int64)
    return workers, np.array([last[w] for w in workers], dtype=np.int64)


def _extend(
    session: Session,
    job: Job,
    entry: _Entry,
    hi: int | None,
    on_read: OnRead | None,
    skip: Sequence[tuple[int, int]] = (),
) -> _Entry | None:
    """`entry` with the steps after its newest; None when its newest step's records are gone."""
    records = read_window(session=session, job=job, from_step=entry.through, to_step=hi)
    if on_read is not None:
        on_read(records, entry.through)
    return _extend_with(entry, records, skip)


def _extend_with(entry: _Entry, records: StepColumns, skip: Sequence[tuple[int, int]] = ()) -> _Entry | None:
    """`entry` with the complete steps of `records` (which start at its newest step) after it."""
    workers, last_seen = _workers(records)
    if not np.isin(workers, entry.workers).all():
        return None  # a worker joined: which steps are complete changes
    last_seen = np.maximum(entry.last_seen, _at(workers, last_seen, entry.workers))
    complete = complete_steps(records, entry.workers.size)
    if not len(complete) or int(complete.step.min()) != entry.through:
        return None  # retention or a rewrite took the step the new ones continue from
    if int(complete.step.max()) == entry.through:
        return replace(entry, last_seen=last_seen)
    new = _build(complete, entry.workers, last_seen, entry.key, entry.through + 1, skip)
    if new is None:
        return replace(entry, last_seen=last_seen)
    ops, labels = merge_tables(entry.ops, entry.labels, new.ops, new.labels)
    newest = [(entry.ops.op_types, entry.type_newest), (new.ops.op_types, new.type_newest)]
    return _Entry(
        key=entry.key,
        ops=ops,
        labels=labels,
        workers=entry.workers,
        last_seen=last_seen,
        through=new.through,
        times=np.concatenate([entry.times, new.times]),
        row_steps=np.concatenate([entry.row_steps, new.row_steps]),
        type_newest=_newest_by_type(ops, newest),
    )


def _build(
    records: StepColumns,
    workers: np.ndarray,
    last_seen: np.ndarray,
    key: Hashable,
    first: int | None,
    skip: Sequence[tuple[int, int]] = (),
) -> _Entry | None:
    """Ops of the complete steps of `records` from `first` on (earlier ones lend their tail),
    but those of steps in `skip`."""
    complete = complete_steps(records, workers.size)
    if not len(complete):
        return None
    ops, labels = build_labelled_op_table(complete)
    times = _step_times(complete)
    keep = ops.step >= first if first is not None else np.ones(len(ops), dtype=bool)
    if first is not None:
        times = times[times[:, 0] >= first]
    row_steps, type_newest = _row_facts(ops, keep)
    for a, b in skip:
        keep &= (ops.step < a) | (ops.step >= b)
    if not keep.all():
        ops = ops.take(keep)
    return _Entry(
        key=key,
        ops=ops,
        labels=labels,
        workers=workers,
        last_seen=last_seen,
        through=int(complete.step.max()),
        times=times,
        row_steps=row_steps,
        type_newest=type_newest,
    )


def _row_facts(ops: OpTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the `rows` of `ops`: the steps that have any (ascending), and per op type the newest
    step with one (the minimum int64 where none)."""
    types = len(ops.op_types)
    newest = np.full(types, np.iinfo(np.int64).min)
    step = ops.step[rows]
    if not step.size:
        return np.zeros(0, dtype=np.int64), newest
    # Over the distinct steps, not the span of step numbers (a gap of 10^12 between two steps
    # would be a bincount of 10^12 × types).
    steps, index = dense_index(step)
    span = steps.size
    counts = np.bincount(ops.op_type[rows].astype(np.int64) * span + index, minlength=types * span)
    seen = counts.reshape(types, span) > 0
    row_steps = steps[seen.any(axis=0)].astype(np.int64)
    has = seen.any(axis=1)
    newest[has] = steps[span - 1 - np.argmax(seen[has, ::-1], axis=1)]
    return row_steps, newest


def _trim(entry: _Entry, lo: int) -> _Entry:
    """The entry without the steps before `lo`; op types left without ops are dropped, as a
    table built over the remaining steps (warm-up ones included) would not have them."""
    if not entry.row_steps.size or int(entry.row_steps[0]) >= lo:
        return entry
    keep = entry.type_newest >= lo
    rows = entry.ops.step >= lo
    ops = entry.ops if rows.all() else entry.ops.take(rows)
    return replace(
        entry,
        ops=drop_unused_types(ops, keep),
        times=entry.times[entry.times[:, 0] >= lo],
        row_steps=entry.row_steps[entry.row_steps >= lo],
        type_newest=entry.type_newest[keep],
    )


def _workers(records: StepColumns) -> tuple[np.ndarray, np.ndarray]:
    """The sorted worker ids in `records`, and the newest step each reported."""
    ids = records.dp_rank.astype(np.int64) << 32 | records.pp_rank.astype(np.int64)
    workers, index = np.unique(ids, return_inverse=True)
    last_seen = np.full(workers.size, np.iinfo(np.int64).min)
    np.maximum.at(last_seen, index.ravel(), records.step)
    return workers, last_seen


def _at(workers: np.ndarray, values: np.ndarray, into: np.ndarray) -> np.ndarray:
    """`values` of `workers` placed at their positions in `into` (a superset); others the minimum."""
    out = np.full(into.size, np.iinfo(np.int64).min)
    out[np.searchsorted(into, workers)] = values
    return out


def _step_times(records: StepColumns) -> np.ndarray:
    """[steps, 3]: each step, its records' first start and last end (the wall time it covered)."""
    if not len(records):
        return np.zeros((0, 3))
    order = np.argsort(records.step, kind="stable")
    step = records.step[order]
    start = records.start_time[order]
    end = start + records.duration[order]
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    return np.column_stack(
        [step[first].astype(np.float64), np.minimum.reduceat(start, first), np.maximum.reduceat(end, first)]
    )
