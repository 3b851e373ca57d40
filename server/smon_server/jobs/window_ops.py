"""A job's analysis window as an op table, built incrementally from one pass to the next.

Reading a 4,096-rank × 500-step window and building its op table is most of a cold pass (tens of
seconds). From one pass to the next only the newest steps change, so the process that analyses a
job keeps the job's op table and, each pass, reads and builds only the steps after the newest one
it holds, merges them in and drops the steps that slid out of the window.

The data goes one way, a chunk at a time: the store's reader yields records
(store/window_reader.py), the converter turns each chunk's complete steps into an op table
(whatif/inputs/step_table.py), merge joins the chunks' tables (whatif/inputs/merge.py), and the
cache keeps the result for the next pass (jobs/window_cache.py). This module only conducts.

What may be kept: every step up to the newest *complete* step M (every worker reported it) is
settled. An agent ships its records in step order and resends unacked batches before newer ones,
so once every worker has reported M, a record of an earlier step that has not arrived never will
(it was dropped and counted by its agent). The cache is keyed by what would change a settled
step: the job's agents (a restarted rank re-runs steps under a new agent, and a new rank changes
which steps are complete) and its restarts. Anything else, and a cached table that no longer
reaches the window, means a cold build, which gives the same table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy.orm import Session

from smon_server.columns import StepColumns, reporting_workers
from smon_server.jobs.window_cache import EngineSlot, Kept, WindowCache
from smon_server.store import window_reader
from smon_server.store.models import Job
from smon_server.store.window_reader import Chunk
from smon_server.whatif.inputs import merge
from smon_server.whatif.inputs.step_table import StepTable, convert
from smon_server.whatif.ops import OpTable

log = logging.getLogger(__name__)

StepTimes = list[tuple[int, float, float]]
# Told of every read of records and its lower step bound (store/phase_grids.Collector.add).
OnRead = Callable[[StepColumns, int | None], None]


@dataclass
class WindowOps:
    """Ops of the complete steps from `lo` on, and each such step's wall-clock span."""

    ops: OpTable | None
    times: StepTimes  # (step, first start, last end), ascending
    incremental: bool  # built on a cached table (for tests and the benchmark)
    # Where the engine keeps what it can reuse at the window's next pass (None: not kept).
    engine: EngineSlot | None = None


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
    span: tuple[int, int] | None = None,
) -> WindowOps:
    """The op table of the complete steps in [lo, hi] (from the cache where it can be), without
    the ops of steps in the `skip` ranges ([a, b): warm-up steps, which the analysis leaves out;
    each chunk drops them as it is built, rather than the whole table being copied without
    them); its op types are those of the table with them. `skip` must be the same for every
    pass under one `key`. `on_read` sees every batch of records read, so the pass can derive
    more from them without reading them again (the phase heatmaps). `span` is kept with the
    table: [lo, hi] when every step number in it has records (WindowCache.span)."""
    held = cache.held_key((job.job_id, job.attempt)) if cache is not None else None
    entry = cache.get((job.job_id, job.attempt), key) if cache is not None else None
    why = "" if entry is not None or held is None else "its agents or restarts changed"
    behind = entry is not None and (lo is None or entry.table.through < lo - 1)
    if behind or (entry is not None and hi is not None and hi < entry.table.through):
        entry, why = None, "the window moved past what was kept"
    if entry is not None:
        entry = _extend(session, job, entry, hi, on_read, skip)
        why = why or ("its new records do not continue it" if entry is None else "")
    if entry is not None and lo is not None and int(entry.last_seen.min()) < lo - 1:
        entry, why = None, "a worker left the window"
    if why:  # seconds of a pass at thousands of ranks: worth a line when it happens
        log.info("job %s (attempt %d): kept window rebuilt whole: %s", job.job_id, job.attempt, why)
    incremental = entry is not None
    if entry is None:
        entry = _cold(session, job, lo, hi, key, on_read, skip)
    if entry is None:
        return WindowOps(None, [], incremental=False)
    if lo is not None:
        entry = replace(entry, table=merge.trim(entry.table, lo))
    if cache is not None:
        cache.put((job.job_id, job.attempt), replace(entry, span=span))
    # One tolist, not three numpy scalars converted per step (~2% of a small job's pass).
    times = [(int(s), a, b) for s, a, b in entry.table.times.tolist()]
    ops = entry.table.ops if len(entry.table.ops) else None
    return WindowOps(ops, times, incremental=incremental, engine=entry.engine if cache is not None else None)


def _tell(on_read: OnRead | None, chunk: Chunk) -> None:
    if on_read is not None:
        on_read(chunk.records, chunk.from_step)


def _cold(
    session: Session,
    job: Job,
    lo: int | None,
    hi: int | None,
    key: Hashable,
    on_read: OnRead | None,
    skip: Sequence[tuple[int, int]],
) -> Kept | None:
    """The window built from its records alone: read whole when small, else chunk by chunk,
    each chunk's new complete steps converted as it comes and the tables joined once at the end."""
    # One step before the window: steps are cut at their last collective, and the window's
    # first step starts with the tail of the one before it (whatif/inputs/from_steps.py).
    first = lo - 1 if lo is not None else None
    if lo is None or hi is None or window_reader.read_whole(job, lo, hi):
        return _whole(session, job, first, hi, lo, key, on_read, skip)
    workers, last_seen = window_reader.window_workers(session, job, lo - 1, hi)
    if not workers.size:
        return None
    tables: list[StepTable] = []
    carry: StepColumns | None = None  # records from the newest complete step on, for the next chunk
    for chunk in window_reader.chunks(session, job, lo - 1, hi):
        _tell(on_read, chunk)
        records = chunk.records if carry is None else StepColumns.concat([carry, chunk.records])
        del chunk  # the concatenation is the copy that counts now
        if not tables:
            table = convert(records, workers.size, lo, skip).table
        else:
            through = tables[-1].through
            seen, _ = reporting_workers(records)
            got = (
                convert(records, workers.size, through + 1, skip, through)
                if np.isin(seen, workers).all()
                else None
            )
            if got is None or (got.oldest is not None and got.oldest < through):
                # The records changed under the read (a new rank, a restart): read it whole.
                return _whole(session, job, lo - 1, hi, lo, key, on_read, skip)
            table = got.table
        if table is not None:
            tables.append(table)
        carry = records if not tables else records.take(records.step >= tables[-1].through)
    if not tables:
        return None
    del table, records, carry  # the list is the tables' only reference: join lets go as it joins
    return Kept(key=key, table=merge.join(tables), workers=workers, last_seen=last_seen)


def _whole(
    session: Session,
    job: Job,
    from_step: int | None,
    to_step: int | None,
    lo: int | None,
    key: Hashable,
    on_read: OnRead | None,
    skip: Sequence[tuple[int, int]],
) -> Kept | None:
    """The window from one read of steps [from_step, to_step]."""
    chunk = window_reader.read(session, job, from_step, to_step)
    _tell(on_read, chunk)
    workers, last_seen = reporting_workers(chunk.records)
    table = convert(chunk.records, workers.size, lo, skip).table
    return Kept(key=key, table=table, workers=workers, last_seen=last_seen) if table is not None else None


def _extend(
    session: Session,
    job: Job,
    entry: Kept,
    hi: int | None,
    on_read: OnRead | None,
    skip: Sequence[tuple[int, int]],
) -> Kept | None:
    """`entry` with the complete steps after its newest, read as one chunk from that step on;
    None when they cannot continue it (a worker joined, or its newest step's records are gone)."""
    chunk = window_reader.read(session, job, entry.table.through, hi)
    _tell(on_read, chunk)
    records = chunk.records
    del chunk
    workers, last_seen = reporting_workers(records)
    if not np.isin(workers, entry.workers).all():
        return None  # a worker joined: which steps are complete changes
    last_seen = np.maximum(entry.last_seen, _at(workers, last_seen, entry.workers))
    through = entry.table.through
    got = convert(records, entry.workers.size, through + 1, skip, through)
    if got.oldest != through:
        return None  # retention or a rewrite took the step the new ones continue from
    if got.table is None:
        return replace(entry, last_seen=last_seen)
    return replace(entry, table=merge.extend(entry.table, got.table), last_seen=last_seen)


def _at(workers: np.ndarray, values: np.ndarray, into: np.ndarray) -> np.ndarray:
    """`values` of `workers` placed at their positions in `into` (a superset); others the minimum."""
    out = np.full(into.size, np.iinfo(np.int64).min)
    out[np.searchsorted(into, workers)] = values
    return out
