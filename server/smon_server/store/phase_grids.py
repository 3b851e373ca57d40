"""Phase heatmaps stored as the API serves them: one row per (job, metric, step), every rank's
seconds as float32 (table `phase_columns`, migration 0008).

A phase heatmap of a 4,096-rank × 500-step window read from the raw step records decodes two
million records and their spans on every request (about 10 s). The analysis pass reads those
records anyway (jobs/window_ops.py: the whole window cold, then only the steps from its newest
complete one on), so it turns each read into these columns, and a request reads 500 rows of
16 kB (tens of milliseconds), or with a rank zoom only the zoomed ranks' bytes of each.

The values are those `StepColumns.phase_seconds` gives the raw path, to the bit: float32, the
resolution the grid and the spans already have (float16 would change the digits shown).
Rows cover the analysis window of the last pass; older steps are deleted as the window slides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, literal, select
from sqlalchemy.orm import Session, aliased

from smon_server.columns import StepColumns, dense_codes, dense_index
from smon_server.grid import Grid
from smon_server.store import copy_binary
from smon_server.store.kinds import kind_code
from smon_server.store.models import Job, PhaseColumn

# Metrics that are not span kinds (codes of span kinds are >= 0).
STEP_TIME, GC, OTHER = -1, -2, -3
SPECIAL = {"step_time": STEP_TIME, "gc": GC, "other": OTHER}
# The most ranks a row's `seconds` can hold: float32 each in a bytea of at most 1 GB.
MAX_ROW_RANKS = (1 << 28) - 1
# Ranks up to this many past twice those with records are stored densely, gaps and all.
SPARSE_RANKS = 1024
# A phase no agent reported has no rows: its grid is the window's, every cell null (as the raw
# path gives it; a dashboard may offer the standard phases before any agent reported them).
UNREPORTED = -32768


@dataclass(frozen=True)
class Columns:
    """The heatmap columns of one read of records: per step, each metric's value of every rank."""

    from_step: int | None  # the read's lower bound: every record from it on was read
    steps: np.ndarray  # [s] int64, ascending
    present: np.ndarray  # [s, n] bool: rank has a record of the step
    metrics: dict[int, np.ndarray]  # code -> [s, n] float32, NaN where no value
    # The ranks were too sparse to store densely (a few ranks numbered far apart): nothing is
    # stored for the pass, and the job's phase heatmaps come from its raw records.
    sparse: bool = False

    @property
    def nbytes(self) -> int:
        return int(self.present.nbytes + sum(v.nbytes for v in self.metrics.values()))


def from_records(records: StepColumns, from_step: int | None) -> Columns:
    """Columns of `records` (at most one record per rank and step, as read_window gives them)."""
    if not len(records):
        return Columns(from_step, np.zeros(0, np.int64), np.zeros((0, 0), bool), {})
    n = int(records.rank.max()) + 1
    if n > 2 * dense_index(records.rank)[0].size + SPARSE_RANKS:
        # Rows are as wide as the highest rank: two ranks numbered 0 and 10^6 would make every
        # step's row a million cells. Memory follows the records, not the rank numbers.
        return Columns(from_step, np.zeros(0, np.int64), np.zeros((0, 0), bool), {}, sparse=True)
    steps, col = np.unique(records.step, return_inverse=True)
    col = col.ravel()
    row = records.rank

    def grid(values: np.ndarray) -> np.ndarray:
        out = np.full((steps.size, n), np.nan, dtype=np.float32)
        out[col, row] = values
        return out

    present = np.zeros((steps.size, n), dtype=bool)
    present[col, row] = True
    metrics = {
        STEP_TIME: grid(records.duration),
        GC: grid(records.phase_seconds("gc")),
        OTHER: grid(records.phase_seconds("other")),
    }
    # Every span kind's seconds per record in one bincount over (record, kind): the same sums,
    # in the same order, as phase_seconds gives one kind at a time.
    codes, kind_index = dense_codes(records.span_kind)
    if not codes.size:
        return Columns(from_step, steps.astype(np.int64), present, metrics)
    span_record = records.span_record
    bins = span_record * codes.size + kind_index.ravel()
    size = len(records) * codes.size
    total = np.bincount(bins, weights=records.span_duration, minlength=size).reshape(-1, codes.size)
    seen = np.bincount(bins, minlength=size).reshape(-1, codes.size) > 0
    for i, code in enumerate(codes):
        if records.kinds[int(code)] in SPECIAL:
            continue  # e.g. spans of kind `gc`: the metric `gc` is every GC pause (phase_seconds)
        metrics[int(code)] = grid(np.where(seen[:, i], total[:, i], np.nan))
    return Columns(from_step, steps.astype(np.int64), present, metrics)


@dataclass
class Collector:
    """The columns of every read one pass makes. A read from a lower step supersedes the reads
    from its bound on (a cold build that falls back to reading the window whole)."""

    parts: list[Columns] = field(default_factory=list)

    def add(self, records: StepColumns, from_step: int | None) -> None:
        low = -(2**63) if from_step is None else from_step
        self.parts = [p for p in self.parts if p.from_step is not None and p.from_step < low]
        self.parts.append(from_records(records, from_step))

    def update(self, keep_from: int | None) -> Update | None:
        if not self.parts or any(p.sparse for p in self.parts):
            return None
        bounds = [p.from_step for p in self.parts]
        return Update(
            parts=self.parts,
            keep_from=keep_from,
            rewrite_from=None if any(b is None for b in bounds) else min(b for b in bounds if b is not None),
        )


@dataclass(frozen=True)
class Update:
    """What a pass stores: rows of steps >= keep_from (the window's first step); rows from
    rewrite_from on are replaced (None: all of the job's), older ones in the window are kept."""

    parts: Sequence[Columns]
    keep_from: int | None
    rewrite_from: int | None


def write(session: Session, job_key: int, update: Update) -> int:
    """Store one pass's columns (the caller holds the job's lease); returns rows written."""
    where = PhaseColumn.job_key == job_key
    rewrite_from = update.rewrite_from
    if rewrite_from is not None:
        # The kept rows must reach the step this pass continues from (the pass that read it
        # stored it); else a pass's rows were lost (its transaction failed) and the kept ones
        # would leave a gap: keep none, serve the shorter stretch.
        newest = session.scalar(
            select(func.max(PhaseColumn.step)).where(where, PhaseColumn.metric == STEP_TIME)
        )
        if newest is None or newest < rewrite_from:
            rewrite_from = None
    gone = PhaseColumn.step >= rewrite_from if rewrite_from is not None else literal(True)
    if update.keep_from is not None:
        gone = gone | (PhaseColumn.step < update.keep_from)
    session.execute(delete(PhaseColumn).where(where, gone))
    if session.get_bind().dialect.name == "postgresql":
        count, body = _binary_rows(job_key, update)
        if count:
            driver = session.connection().connection.driver_connection
            with driver.cursor().copy(  # type: ignore[union-attr]
                "COPY phase_columns (job_key, metric, step, present, seconds) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.write(copy_binary.HEADER + body + copy_binary.TRAILER)
        return count
    rows = list(_rows(job_key, update))
    if rows:
        session.execute(
            insert(PhaseColumn),
            [dict(zip(("job_key", "metric", "step", "present", "seconds"), r, strict=True)) for r in rows],
        )
    return len(rows)


def _binary_rows(job_key: int, update: Update) -> tuple[int, bytes]:
    """The rows `_rows` makes, as binary COPY rows built a metric at a time: 500 steps × 8
    metrics of a 4,096-rank window are 4,000 rows of 16 kB, which `write_row` adapted one value
    at a time (~0.7 s a cold pass). Grouped by metric rather than by step; COPY does not care."""
    count, out = 0, []
    for part in update.parts:
        keep = np.ones(part.steps.size, bool) if update.keep_from is None else part.steps >= update.keep_from
        index = np.flatnonzero(keep)
        ranks = part.present.shape[1]
        if not index.size or not ranks:
            continue
        presence = np.packbits(part.present[index], axis=1)
        out.append(
            _copy_rows(job_key, STEP_TIME, part.steps[index], presence, part.metrics[STEP_TIME][index])
        )
        count += index.size
        for code, grid in part.metrics.items():
            if code == STEP_TIME:
                continue
            rows = index[~np.isnan(grid[index]).all(axis=1)]
            if rows.size:
                out.append(_copy_rows(job_key, code, part.steps[rows], None, grid[rows]))
                count += rows.size
    return count, b"".join(out)


def _copy_rows(
    job_key: int, metric: int, steps: np.ndarray, present: np.ndarray | None, seconds: np.ndarray
) -> bytes:
    """Binary COPY rows of one metric (store/copy_binary.py has the format)."""
    width = seconds.shape[1] * 4
    fields: list[tuple[str, str]] = [
        ("fields", ">i2"), ("job_key_len", ">i4"), ("job_key", ">i4"), ("metric_len", ">i4"),
        ("metric", ">i2"), ("step_len", ">i4"), ("step", ">i8"), ("present_len", ">i4"),
    ]  # fmt: skip
    if present is not None:
        fields.append(("present", f"V{present.shape[1]}"))
    fields += [("seconds_len", ">i4"), ("seconds", f"V{width}")]
    rows = np.empty(steps.size, dtype=np.dtype(fields))
    rows["fields"] = 5
    rows["job_key_len"], rows["job_key"] = 4, job_key
    rows["metric_len"], rows["metric"] = 2, metric
    rows["step_len"], rows["step"] = 8, steps
    if present is None:
        rows["present_len"] = -1
    else:
        rows["present_len"] = present.shape[1]
        rows["present"] = (
            np.ascontiguousarray(present, dtype=np.uint8).view(f"V{present.shape[1]}").reshape(-1)
        )
    rows["seconds_len"] = width
    rows["seconds"] = np.ascontiguousarray(seconds, dtype="<f4").view(f"V{width}").reshape(-1)
    return rows.tobytes()


Row = tuple[int, int, int, bytes | None, bytes]


def _rows(job_key: int, update: Update) -> list[Row]:
    out: list[Row] = []
    for part in update.parts:
        keep = np.ones(part.steps.size, bool) if update.keep_from is None else part.steps >= update.keep_from
        for i in np.flatnonzero(keep):
            step = int(part.steps[i])
            presence = np.packbits(part.present[i]).tobytes()
            out.append((job_key, STEP_TIME, step, presence, _bytes(part.metrics[STEP_TIME][i])))
            for code, grid in part.metrics.items():
                if code != STEP_TIME and not np.isnan(grid[i]).all():
                    out.append((job_key, code, step, None, _bytes(grid[i])))
    return out


def _bytes(values: np.ndarray) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def drop_finished(session: Session, *, seen_before: float) -> int:
    """Rows of jobs last heard from before `seen_before` (retention: their raw steps are gone)."""
    old = select(Job.key).where(Job.last_seen < seen_before).scalar_subquery()
    return int(session.execute(delete(PhaseColumn).where(PhaseColumn.job_key.in_(old))).rowcount or 0)  # type: ignore[attr-defined]


def metric_code(session: Session, job_key: int, name: str) -> int:
    """The code `name` is stored under for the job attempt: step_time, gc, other, or one of its
    span kinds (UNREPORTED if none of its agents reported a phase of that name)."""
    if name in SPECIAL:
        return SPECIAL[name]
    code = kind_code(session, job_key, name)
    return UNREPORTED if code is None else int(code)


def stored_range(session: Session, job_key: int) -> tuple[int, int] | None:
    """First and last step the job's stored columns cover (None when nothing is stored)."""
    lo, hi = session.execute(
        select(func.min(PhaseColumn.step), func.max(PhaseColumn.step)).where(
            PhaseColumn.job_key == job_key, PhaseColumn.metric == STEP_TIME
        )
    ).one()
    return None if lo is None else (int(lo), int(hi))


def read(
    session: Session,
    job_key: int,
    code: int,
    *,
    from_step: int,
    to_step: int,
    from_rank: int | None = None,
    to_rank: int | None = None,
) -> Grid:
    """The stored grid of metric `code` over steps [from_step, to_step], of the ranks in
    [from_rank, to_rank] that have a record in it: only those ranks' bytes are read."""
    # A row holds at most MAX_ROW_RANKS ranks (a bytea is at most 1 GB), and PostgreSQL's
    # substr takes int4 offsets: a zoom past it (from_rank=2147483647, a valid rank) is
    # clamped there, where it finds no rank, rather than overflowing 4 × rank.
    first = min(max(from_rank or 0, 0), MAX_ROW_RANKS)
    to_rank = None if to_rank is None else min(to_rank, MAX_ROW_RANKS)
    p, v = aliased(PhaseColumn), aliased(PhaseColumn)
    present: Any = p.present
    seconds: Any = v.seconds if code != STEP_TIME else p.seconds
    if first or to_rank is not None:
        skip = first // 8  # presence bytes before the first rank's
        if to_rank is None:
            present = func.substr(p.present, skip + 1)
            seconds = func.substr(seconds, 4 * first + 1)
        else:
            count = max(to_rank - first + 1, 0)
            present = func.substr(p.present, skip + 1, (first + count + 7) // 8 - skip)
            seconds = func.substr(seconds, 4 * first + 1, 4 * count)
    stmt = select(p.step, present, seconds).where(
        p.job_key == job_key, p.metric == STEP_TIME, p.step >= from_step, p.step <= to_step
    )
    if code != STEP_TIME:
        stmt = stmt.outerjoin(v, (v.job_key == p.job_key) & (v.metric == code) & (v.step == p.step))
    rows = session.execute(stmt.order_by(p.step)).all()
    steps = np.array([int(r[0]) for r in rows], dtype=np.int64)
    bits = [np.unpackbits(np.frombuffer(bytes(r[1] or b""), dtype=np.uint8))[first % 8 :] for r in rows]
    width = max((b.size for b in bits), default=0)
    if to_rank is not None:
        width = min(width, max(to_rank - first + 1, 0))
    has = np.zeros((len(rows), width), dtype=bool)
    values = np.full((len(rows), width), np.nan, dtype=np.float32)
    for i, (b, r) in enumerate(zip(bits, rows, strict=True)):
        has[i, : min(b.size, width)] = b[:width]
        if r[2]:
            got = np.frombuffer(bytes(r[2]), dtype="<f4")[:width]
            values[i, : got.size] = got
    ranks = np.flatnonzero(has.any(axis=0))
    return Grid(
        (ranks + first).astype(np.int64), steps, np.ascontiguousarray(values[:, ranks].T, dtype=np.float32)
    )
