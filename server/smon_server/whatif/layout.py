"""The op table laid out densely as [slot, step, dp replica]: the shape the replay runs over.

A *slot* is one operation of one step of one DP replica, named by (stage, op type, seq_id): the
same slot exists on every step and every DP rank, because a training step runs the same program
each time. Laying the table out this way turns every later pass (transfer times, idealisation,
replay of all what-if variants) into array arithmetic, with no per-operation Python loop and no
sort of the rows.

Decisions (docs/analysis.md has the reasoning):
- Steps not seen on every worker are dropped and counted (the newest step is usually partial).
- A slot missing on some (step, worker) is *absent*: duration 0, start NaN. An absent compute op
  costs nothing; an absent collective still joins its group (it cannot complete without that
  rank), with zero transfer time.
- A worker's main stream (everything but the four p2p kinds) runs in the *recorded* order; the
  template takes it from the mean start of each slot relative to the worker's first op of the
  step, which is exactly the recorded order whenever every step runs the same program (true on
  all conformance traces). Instances whose recorded order differs are counted.
- Two rows with the same (step, worker, op type, seq_id) are duplicates: one is kept, and the
  count is reported.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from smon_server.whatif import ops as O
from smon_server.whatif.ops import OpTable


class AnalysisError(ValueError):
    """The op table cannot be analysed (empty, no complete step, inconsistent structure)."""


@dataclass(frozen=True)
class LayoutQuality:
    """What the layout had to drop or repair; reported with every result."""

    rows_used: int
    dropped_steps: int  # steps not seen on every worker
    duplicate_ops: int  # rows repeating a (step, worker, op type, seq_id)
    absent_ops: int  # template slots missing on some (step, worker), zero-filled
    reordered_instances: int  # (step, worker) whose recorded order differs from the template
    missing_workers: int  # (dp rank, stage) pairs never seen in a grid where both ids occur
    invalid_rows: int = 0  # NaN / infinite start or duration, negative duration: dropped
    device_timed_ops: int = 0  # ops timed on the device that came with the host's view
    host_line_ops: int = 0  # of those, replayed by the host's time (host-bound steps: host_line.py)


@dataclass(frozen=True)
class PerStep:
    """Per step of a layout: the terms of its window-wide sums (whatif/incremental.py)."""

    rows: np.ndarray  # [n_steps] rows laid out (duplicates included)
    present: np.ndarray  # [n_steps] instances present
    reordered: np.ndarray  # [n_steps] (dp) instances out of the main order
    rel_sum: np.ndarray  # [n_slots, n_steps] main slots: Σ over DP of start - the step's first start
    rel_count: np.ndarray  # [n_slots, n_steps] how many of those were present
    worker_seen: np.ndarray  # [n_dp, n_stages] workers with any op in the window


@dataclass
class StepLayout:
    """Dense per-slot arrays. Axis order everywhere: [slot, step, dp]."""

    op_types: tuple[str, ...]
    steps: np.ndarray  # [n_steps] step numbers
    dp_ranks: np.ndarray  # [n_dp] DP rank ids
    stages: np.ndarray  # [n_stages] stage ids
    slot_stage: np.ndarray  # [n_slots] index into `stages`; slots of one stage are contiguous
    slot_type: np.ndarray  # [n_slots] op type code
    slot_seq: np.ndarray  # [n_slots]
    slot_chunk: np.ndarray  # [n_slots]
    main_order: list[np.ndarray]  # per stage index: main-stream slots in recorded order
    start: np.ndarray  # [n_slots, n_steps, n_dp], NaN where absent; relative to step_origin
    duration: np.ndarray  # [n_slots, n_steps, n_dp], 0 where absent
    present: np.ndarray  # [n_slots, n_steps, n_dp] bool
    step_origin: np.ndarray  # [n_steps] float64: `start` is relative to it
    ranks: np.ndarray  # [n_dp, n_stages] global rank of each worker (-1 unknown)
    quality: LayoutQuality
    ends_at_last_op: bool = False  # OpTable.ends_at_last_op
    # What the layout's window-wide figures are sums of, step by step: a later analysis of the
    # same window slid on lays out only its new steps and adds them (whatif/incremental.py).
    per_step: PerStep | None = None

    @property
    def n_slots(self) -> int:
        return int(self.slot_type.shape[0])

    def type_name(self, slot: int) -> str:
        return self.op_types[int(self.slot_type[slot])]


ROW_CHUNK = 1 << 21  # rows per indexing pass: bounds the temporaries on tables of ~10^8 rows


class _Ids:
    """Distinct values of one small-integer column, found with a bincount (no sort of the rows)."""

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.span = lo, hi - lo + 1
        self.count = np.zeros(self.span, dtype=np.int64)

    @classmethod
    def of(cls, values: np.ndarray) -> _Ids:
        return cls(int(values.min()), int(values.max()))

    def add(self, values: np.ndarray) -> None:
        self.count += np.bincount(values - self.lo, minlength=self.span)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct values, a map from value - lo to their dense index, -1 for unseen)."""
        seen = self.count > 0
        index = (np.cumsum(seen) - 1).astype(np.int32)
        index[~seen] = -1
        return np.flatnonzero(seen) + self.lo, index


def build_layout(table: OpTable, dtype: npt.DTypeLike = np.float64) -> StepLayout:
    """Dense layout of `table`. Start times are stored relative to an origin per step (the start
    of one of its ops), which keeps float32 layouts (`dtype`, for large jobs) precise to a few
    microseconds however far from the epoch the clock is."""
    n = len(table)
    if n == 0:
        raise AnalysisError("the op table is empty: nothing to analyse")
    # Ingest and the trace loader reject bad rows already; a table built elsewhere may not have.
    valid = np.isfinite(table.start)
    valid &= table.duration >= 0  # False for NaN too
    valid &= table.duration < np.inf
    if not valid.all():
        layout = build_layout(table.take(valid), dtype)
        layout.quality = replace(layout.quality, invalid_rows=n - int(valid.sum()))
        return layout
    del valid
    if int(table.seq_id.min()) < 0 or int(table.dp_rank.min()) < 0 or int(table.stage.min()) < 0:
        raise AnalysisError("dp_rank, stage and seq_id must not be negative")
    # Steps, DP ranks and stages are numbers a client chose (steps counted in samples, a corrupt
    # record; ranks anywhere below a world size it declared), and the arrays below are sized by
    # their spans: mostly-empty spans are renumbered first, so memory follows the rows.
    for column, axis in (("step", "steps"), ("dp_rank", "dp_ranks"), ("stage", "stages")):
        values = getattr(table, column)
        sparse = _sparse_numbers(values)
        if sparse is not None:
            numbers, renumbered = sparse
            columns: dict[str, Any] = {column: renumbered.astype(values.dtype)}
            layout = build_layout(replace(table, **columns), dtype)
            setattr(layout, axis, numbers[getattr(layout, axis)].astype(np.int64))
            return layout
    n_types = len(table.op_types)
    n_seq = int(table.seq_id.max()) + 1
    # DP ranks and stages index the grid by their raw value (dense now; ranks never seen are
    # squeezed out below); steps and slot keys are numbered through a bincount of their values.
    dp_lo, st_lo = int(table.dp_rank.min()), int(table.stage.min())
    dp_span = int(table.dp_rank.max()) - dp_lo + 1
    st_span = int(table.stage.max()) - st_lo + 1
    if st_span * n_types * n_seq > max(1 << 22, 4 * n):
        raise AnalysisError(f"seq_id up to {n_seq - 1} is implausible for one step's op count")
    step_lo, step_hi = int(table.step.min()), int(table.step.max())

    def slot_keys(lo: int, hi: int, stride: int = 1) -> np.ndarray:
        key = table.stage[lo:hi:stride].astype(np.int32)
        key -= st_lo
        key *= n_types
        key += table.op_type[lo:hi:stride]
        key *= n_seq
        key += table.seq_id[lo:hi:stride]
        return key

    # Which steps and slot keys exist: first from a sample of the rows (a step or an op kind
    # has thousands of rows on a large job); a row the sample missed sends us back for all rows.
    stride = max(1, n // (1 << 18))
    while True:
        step_ids = _Ids(step_lo, step_hi)
        key_ids = _Ids(0, st_span * n_types * n_seq - 1)
        raw_origin = np.zeros(step_ids.span)
        for lo in range(0, n, ROW_CHUNK * stride):
            hi = min(n, lo + ROW_CHUNK * stride)
            step_ids.add(table.step[lo:hi:stride])
            key_ids.add(slot_keys(lo, hi, stride))
            raw_origin[table.step[lo:hi:stride] - step_lo] = table.start[lo:hi:stride]
        steps_all, step_map = step_ids.finish()
        keys, slot_map = key_ids.finish()
        grid = _scatter(
            table, dtype, slot_keys, slot_map, step_map, step_lo, raw_origin,
            dp_lo, dp_span, st_lo, st_span, len(keys), len(steps_all),
        )  # fmt: skip
        if grid is not None:
            break
        stride = 1
    start, duration, slot_chunk, raw_ranks, step_rows = grid
    origin = raw_origin[steps_all - step_lo]
    n_slots = len(keys)
    # Keys are numbered stage-major, so a stage's slots are contiguous.
    slot_seq = (keys % n_seq).astype(np.int32)
    slot_type = ((keys // n_seq) % n_types).astype(np.int32)
    slot_stage_raw = (keys // (n_seq * n_types)).astype(np.int32)

    # A step counts only when every worker that ever reports has reported it.
    present: np.ndarray = ~np.isnan(start)
    stages_raw, slot_stage = np.unique(slot_stage_raw, return_inverse=True)
    n_st = len(stages_raw)
    reported = reported_by_stage(present, slot_stage, n_st)
    worker_seen = np.asarray(reported.any(axis=0))
    dp_seen = np.asarray(worker_seen.any(axis=1))
    complete = np.asarray(reported[:, worker_seen].all(axis=1))
    if not complete.any():
        raise AnalysisError("no step was reported by every worker; nothing complete to analyse")
    dropped_steps = int((~complete).sum())
    if dropped_steps or not dp_seen.all():
        keep = np.ix_(np.arange(n_slots), np.flatnonzero(complete), np.flatnonzero(dp_seen))
        start, duration, present = start[keep], duration[keep], present[keep]
        worker_seen = worker_seen[dp_seen]
    steps, origin = steps_all[complete], origin[complete]
    dp_ranks = np.flatnonzero(dp_seen) + dp_lo
    ranks = raw_ranks.reshape(dp_span, st_span)[np.ix_(dp_ranks - dp_lo, stages_raw)]
    is_p2p = np.array([name in O.P2P_OP_TYPES for name in table.op_types], dtype=bool)[slot_type]
    rel_sum, rel_count = main_start_sums(start, slot_stage, is_p2p, n_st)
    main_order = main_order_of(rel_sum, rel_count, slot_stage, is_p2p, n_st)
    per_step = PerStep(
        rows=step_rows[complete],
        present=np.count_nonzero(present, axis=(0, 2)).astype(np.int64),
        reordered=reordered_per_step(start, main_order),
        rel_sum=rel_sum,
        rel_count=rel_count,
        worker_seen=worker_seen,
    )
    return StepLayout(
        op_types=table.op_types,
        steps=steps,
        dp_ranks=dp_ranks.astype(np.int64),
        stages=(stages_raw + st_lo).astype(np.int64),
        slot_stage=slot_stage.astype(np.int32),
        slot_type=slot_type,
        slot_seq=slot_seq,
        slot_chunk=slot_chunk,
        main_order=main_order,
        start=start,
        duration=duration,
        present=present,
        step_origin=origin,
        ranks=ranks,
        quality=quality_of(table, per_step, slot_stage, n_st, dropped_steps),
        ends_at_last_op=table.ends_at_last_op,
        per_step=per_step,
    )


def reported_by_stage(present: np.ndarray, slot_stage: np.ndarray, n_stages: int) -> np.ndarray:
    """[step, dp, stage]: whether each worker ran any op of its stage on each step (`present` is
    [slot, step, dp]; a stage's slots are contiguous)."""
    bounds = np.searchsorted(slot_stage, np.arange(n_stages + 1))
    return np.stack([present[bounds[s] : bounds[s + 1]].any(axis=0) for s in range(n_stages)], axis=2)


def quality_of(
    table: OpTable, per_step: PerStep, slot_stage: np.ndarray, n_stages: int, dropped_steps: int
) -> LayoutQuality:
    """A layout's quality counts, each a sum of its steps' terms (`per_step`): the same whether the
    layout was built whole or assembled from kept steps (whatif/incremental.py)."""
    per_stage = np.diff(np.searchsorted(slot_stage, np.arange(n_stages + 1)))
    rows_used, n_present = int(per_step.rows.sum()), int(per_step.present.sum())
    expected = int((per_stage * per_step.worker_seen.sum(axis=0)).sum()) * per_step.rows.size
    return LayoutQuality(
        rows_used=rows_used,
        dropped_steps=dropped_steps,
        duplicate_ops=rows_used - n_present,
        absent_ops=max(0, expected - n_present),
        reordered_instances=int(per_step.reordered.sum()),
        missing_workers=int((~per_step.worker_seen).sum()),
        **host_line_counts(table),
    )


def host_line_counts(table: OpTable) -> dict[str, int]:
    """Device-timed ops, and those a host-bound step replays by the host's time: their duration is
    their host view, exactly (a device span's length equals its host view only by chance)."""
    if not table.has_host:
        return {}
    viewed = np.isfinite(table.host_duration)
    return {
        "device_timed_ops": int(viewed.sum()),
        "host_line_ops": int((viewed & (table.duration == table.host_duration)).sum()),
    }


def _sparse_numbers(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(the distinct values, each value's index among them) when they leave most of their span
    empty, else None. Found with a bincount where the span is within a few times the rows (no
    sort: this runs on every table), with a sort where it is not (then it is sparse for sure)."""
    lo, hi = int(values.min()), int(values.max())
    span = hi - lo + 1
    if span <= _DENSE_SPAN:
        return None
    if span > 4 * values.size + (1 << 16):
        numbers, index = np.unique(values, return_inverse=True)
        return numbers, index.ravel()
    seen = np.bincount(values - lo, minlength=span) > 0
    distinct = int(np.count_nonzero(seen))
    if span <= 2 * distinct + _DENSE_SPAN:
        return None
    index = np.cumsum(seen) - 1
    return np.flatnonzero(seen) + lo, index[values - lo]


_DENSE_SPAN = 1024  # a span of numbers this short is laid out as it is, gaps and all


def _scatter(
    table: OpTable,
    dtype: npt.DTypeLike,
    slot_keys: Callable[[int, int], np.ndarray],
    slot_map: np.ndarray,
    step_map: np.ndarray,
    step_lo: int,
    raw_origin: np.ndarray,
    dp_lo: int,
    dp_span: int,
    st_lo: int,
    st_span: int,
    n_slots: int,
    n_steps: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Rows into the dense [slot, step, dp] arrays; None when a row's step or slot key is unknown
    (the sample that found them missed it)."""
    start = np.full((n_slots, n_steps, dp_span), np.nan, dtype=dtype)
    duration = np.zeros((n_slots, n_steps, dp_span), dtype=dtype)
    flat_start, flat_duration = start.reshape(-1), duration.reshape(-1)
    slot_chunk = np.zeros(n_slots, dtype=np.int16)
    raw_ranks = np.full(dp_span * st_span, -1, dtype=np.int32)
    step_rows = np.zeros(n_steps, dtype=np.int64)
    cell_type = np.int32 if start.size < 1 << 31 else np.int64
    for lo in range(0, len(table), ROW_CHUNK):
        hi = min(len(table), lo + ROW_CHUNK)
        slot = slot_map[slot_keys(lo, hi)]
        step = step_map[table.step[lo:hi] - step_lo]
        if slot.min() < 0 or step.min() < 0:
            return None
        step_rows += np.bincount(step, minlength=n_steps)
        dp: np.ndarray = table.dp_rank[lo:hi].astype(cell_type)
        dp -= dp_lo
        cell: np.ndarray = slot.astype(cell_type)
        cell *= n_steps
        cell += step
        cell *= dp_span
        cell += dp
        flat_start[cell] = table.start[lo:hi] - raw_origin[table.step[lo:hi] - step_lo]
        flat_duration[cell] = table.duration[lo:hi]
        slot_chunk[slot] = table.chunk[lo:hi]
        dp *= st_span
        dp += table.stage[lo:hi]
        dp -= st_lo
        raw_ranks[dp] = table.rank[lo:hi]
    return start, duration, slot_chunk, raw_ranks, step_rows


def main_start_sums(
    start: np.ndarray, slot_stage: np.ndarray, is_p2p: np.ndarray, n_stages: int
) -> tuple[np.ndarray, np.ndarray]:
    """[n_slots, n_steps] per main-stream slot and step: the sum over DP replicas of its start
    relative to the worker's first main-stream op of the step, and how many it summed (0 for p2p
    slots). Per step, so that a window's sums are its steps' sums however it was laid out."""
    n_slots, n_steps = start.shape[0], start.shape[1]
    rel_sum = np.zeros((n_slots, n_steps))
    rel_count = np.zeros((n_slots, n_steps), dtype=np.int64)
    bounds = np.searchsorted(slot_stage, np.arange(n_stages + 1))
    # nanmin over a worker without ops of a stage warns; that case is expected.
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for s in range(n_stages):
            lo, hi = int(bounds[s]), int(bounds[s + 1])
            main = np.arange(lo, hi)[~is_p2p[lo:hi]]
            if main.size == 0:
                continue
            block = start[main]  # [k, steps, dp]
            rel = block - np.nanmin(block, axis=0)
            missing = np.isnan(rel)
            np.copyto(rel, 0.0, where=missing)
            rel_sum[main] = rel.sum(axis=2, dtype=np.float64)
            rel_count[main] = rel.shape[2] - np.count_nonzero(missing, axis=2)
    return rel_sum, rel_count


def main_order_of(
    rel_sum: np.ndarray, rel_count: np.ndarray, slot_stage: np.ndarray, is_p2p: np.ndarray, n_stages: int
) -> list[np.ndarray]:
    """Per stage, the main-stream slots in recorded order: by mean relative start over the
    window (main_start_sums), ties by slot."""
    bounds = np.searchsorted(slot_stage, np.arange(n_stages + 1))
    total, count = rel_sum.sum(axis=1), rel_count.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_mean = total / count  # NaN for a slot never present, as nanmean gave
    orders: list[np.ndarray] = []
    for s in range(n_stages):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        main = np.arange(lo, hi)[~is_p2p[lo:hi]]
        orders.append(main[np.lexsort((main, rel_mean[main]))] if main.size else main)
    return orders


def reordered_per_step(start: np.ndarray, orders: list[np.ndarray]) -> np.ndarray:
    """[n_steps]: per step, the (dp) instances whose recorded order differs from `orders`."""
    out = np.zeros(start.shape[1], dtype=np.int64)
    for order in orders:
        if order.size > 1:
            ordered = start[order]
            running = np.fmax.accumulate(ordered, axis=0)
            late = (ordered[1:] < running[:-1]) & ~np.isnan(ordered[1:])
            out += np.count_nonzero(late.any(axis=0), axis=1)
    return out
