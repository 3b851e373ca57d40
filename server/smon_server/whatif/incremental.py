"""A later analysis of a job's window lays out only the steps that are new since the last one.

From one pass to the next a live job's window slides by a few steps: the op table (kept by
jobs/window_ops.py) loses its oldest steps and gains the newest, and everything else in it is
what the last analysis laid out. Laying the window out again (a scatter of every op into the
dense [slot, step, dp] arrays, layout.py) and splitting transfer from waiting again (per step,
durations.py) were about half of the engine's time on a 64-rank job. So the analysis keeps what
is per step (`Reusable`: the measured durations, which instances are present, the recorded step
times, and the per-step terms of the layout's window-wide sums) and `slide` builds the next
window from it and the new steps alone. What is window-wide (D*, the jitter allowance, every
replay) is computed over the whole window as before: it depends on every step.

The result is the one a full build gives: the new steps are laid out by the same code, their
transfers split by the same arithmetic (each step's are its own), and the window-wide sums are
sums of the same per-step terms in the same order. The only inputs that may differ are
each step's time origin (the start of one of its ops: which one depends on the rows a build
samples), which moves start times by a constant: transfers and step times agree to the last
bits of the float width. Whenever the window is not the old one slid on (a slot, worker or
stage appears or disappears, the main-stream order or the float width changes, the rows do not
add up), `slide` answers None and the caller builds the window whole.

`cut` is the other direction: the recent stretch (the newest steps of the window, analysed again
on their own: jobs/step_ranges.py) taken from the window's layout instead of being laid out
again, under the same rule: it answers only when a build of those steps' rows would give the
same slots, workers, main-stream order and float width, else None.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.durations import trace_times, transfers_in_place
from smon_server.whatif.graph import StepGraph, build_graph
from smon_server.whatif.layout import (
    AnalysisError,
    PerStep,
    StepLayout,
    build_layout,
    main_order_of,
    quality_of,
    reordered_per_step,
    reported_by_stage,
)
from smon_server.whatif.ops import OpTable


@dataclass(frozen=True)
class Reusable:
    """What an analysis leaves for the next analysis of the same window slid on."""

    layout: StepLayout  # start and present released; duration is the measured durations
    present: np.ndarray  # [n_slots, n_steps, n_dp]
    trace_step_time: np.ndarray  # [n_steps]

    @property
    def nbytes(self) -> int:
        per_step = self.layout.per_step
        extra = 0 if per_step is None else int(per_step.rel_sum.nbytes + per_step.rel_count.nbytes)
        return int(self.layout.duration.nbytes + self.present.nbytes) + extra


@dataclass(frozen=True)
class Slid:
    """The window laid out from a Reusable and its new steps, ready for durations.ideal_durations."""

    layout: StepLayout  # start and present released; duration is the measured durations
    graph: StepGraph
    present: np.ndarray
    trace_step_time: np.ndarray


def slide(table: OpTable, dtype: np.dtype, kept: Reusable) -> Slid | None:
    """`table`'s window from `kept` and the rows of the steps after its newest, or None when
    `table` is not `kept`'s window slid on (the caller then builds it whole)."""
    old, per = kept.layout, kept.layout.per_step
    if per is None or old.duration.dtype != dtype or not len(table) or not old.steps.size:
        return None
    newest = int(old.steps[-1])
    new_rows = table.since(newest + 1)  # views where the rows are in step order (they are, live)
    n_new = len(new_rows)
    keep = old.steps >= int(table.step.min())
    if not keep.any() or len(table) - n_new != int(per.rows[keep].sum()):
        return None  # the old steps left are not exactly the rows the table has before the new ones
    names = [old.op_types[int(c)] for c in old.slot_type]
    codes = np.array([table.code(name) for name in names], dtype=np.int32)
    if (codes < 0).any():
        return None
    # A full build numbers the slots by (stage, op type code, seq_id): the codes may have moved.
    if not np.array_equal(np.lexsort((old.slot_seq, codes, old.slot_stage)), np.arange(codes.size)):
        return None
    n_slots, n_dp = old.n_slots, len(old.dp_ranks)
    new = _new_steps(new_rows, dtype, old, names) if n_new else _no_steps(n_slots, n_dp, dtype)
    if new is None:
        return None
    start, duration, present_new, steps, origin, rows, rel_sum, rel_count = new

    n_stages = len(old.stages)
    rel_sum = np.concatenate([per.rel_sum[:, keep], rel_sum], axis=1)
    rel_count = np.concatenate([per.rel_count[:, keep], rel_count], axis=1)
    order = _same_order(old, rel_sum, rel_count)
    if order is None:
        return None  # the kept steps' reordered counts were taken against the old order
    present = np.concatenate([kept.present[:, keep], present_new], axis=1)
    reported = reported_by_stage(present, old.slot_stage, n_stages)  # [step, dp, stage]
    worker_seen = np.asarray(reported.any(axis=0))
    if not np.array_equal(worker_seen, per.worker_seen) or not reported[:, worker_seen].all():
        return None  # a worker left the window, or a new step is not complete without it
    if not present.any(axis=(1, 2)).all():
        return None  # a slot slid out of the window: a full build would not have it
    layout = _assemble(
        table,
        old,
        slot_type=codes,
        steps=np.concatenate([old.steps[keep], steps]),
        main_order=order,
        duration=old.duration,  # replaced by the measured durations below
        step_origin=np.concatenate([old.step_origin[keep], origin]),
        per_step=PerStep(
            rows=np.concatenate([per.rows[keep], rows]),
            present=np.concatenate([per.present[keep], np.count_nonzero(present_new, axis=(0, 2))]),
            reordered=np.concatenate([per.reordered[keep], reordered_per_step(start, order)]),
            rel_sum=rel_sum,
            rel_count=rel_count,
            worker_seen=worker_seen,
        ),
        dropped_steps=0,
    )
    graph = _graph(layout)
    if graph is None:
        return None
    trace = trace_times(start, duration)
    measured = transfers_in_place(start, duration, present_new, graph)
    layout.duration = np.concatenate([old.duration[:, keep], measured], axis=1)
    return Slid(
        layout=layout,
        graph=graph,
        present=present,
        trace_step_time=np.concatenate([kept.trace_step_time[keep], trace]),
    )


def cut(table: OpTable, dtype: np.dtype, window: Reusable) -> Slid | None:
    """`table` (rows of the newest steps of `window`'s table, from its first step on) laid out
    from `window`, or None when a build of `table` would not give the window's slots, workers,
    main-stream order or float width (the caller then builds it)."""
    old, per = window.layout, window.layout.per_step
    if per is None or old.duration.dtype != dtype or not len(table) or old.quality.invalid_rows:
        return None
    first, last = int(table.step.min()), int(table.step.max())
    part = old.steps >= first
    n = int(np.count_nonzero(part))
    # The window's steps from `first` on must be the table's complete steps: the same rows.
    if not n or last > int(old.steps[-1]):
        return None
    present = window.present[:, part]
    n_stages = len(old.stages)
    worker_seen = np.asarray(reported_by_stage(present, old.slot_stage, n_stages).any(axis=0))
    if not np.array_equal(worker_seen, per.worker_seen) or not present.any(axis=(1, 2)).all():
        return None  # a worker or a slot of the window is not in these steps: a build differs
    # The table's other steps are those the window dropped (incomplete with the same workers:
    # a build drops them too); the window's steps must have the same rows here.
    rows_used = int(per.rows[part].sum())
    if last - first < 4 * len(table):  # rows per step number by a count (no sort of the rows)
        counts = np.bincount(table.step - first, minlength=last - first + 1)
        rows_there, distinct = int(counts[old.steps[part] - first].sum()), int(np.count_nonzero(counts))
    else:
        numbers, counts = np.unique(table.step, return_counts=True)
        rows_there, distinct = int(counts[np.isin(numbers, old.steps[part])].sum()), int(numbers.size)
    if rows_there != rows_used:
        return None
    dropped = distinct - n
    rel_sum, rel_count = per.rel_sum[:, part], per.rel_count[:, part]
    order = _same_order(old, rel_sum, rel_count)
    if order is None:
        return None  # these steps' recorded order differs from the window's: a build differs
    layout = _assemble(
        table,
        old,
        slot_type=old.slot_type,
        steps=old.steps[part],
        main_order=order,
        duration=np.ascontiguousarray(old.duration[:, part]),  # the measured durations
        step_origin=old.step_origin[part],
        per_step=PerStep(
            rows=per.rows[part],
            present=per.present[part],
            reordered=per.reordered[part],
            rel_sum=rel_sum,
            rel_count=rel_count,
            worker_seen=worker_seen,
        ),
        dropped_steps=dropped,
    )
    graph = _graph(layout)
    if graph is None:
        return None
    return Slid(
        layout=layout,
        graph=graph,
        present=np.ascontiguousarray(present),
        trace_step_time=window.trace_step_time[part],
    )


def _same_order(old: StepLayout, rel_sum: np.ndarray, rel_count: np.ndarray) -> list[np.ndarray] | None:
    """The main-stream order these per-step sums give (as a build takes it), or None when it is
    not `old`'s (the reordered counts kept per step were taken against that one)."""
    is_p2p = np.array([old.type_name(j) in O.P2P_OP_TYPES for j in range(old.n_slots)], dtype=bool)
    order = main_order_of(rel_sum, rel_count, old.slot_stage, is_p2p, len(old.stages))
    same = all(np.array_equal(a, b) for a, b in zip(order, old.main_order, strict=True))
    return order if same else None


def _assemble(
    table: OpTable,
    old: StepLayout,
    *,
    slot_type: np.ndarray,
    steps: np.ndarray,
    main_order: list[np.ndarray],
    duration: np.ndarray,
    step_origin: np.ndarray,
    per_step: PerStep,
    dropped_steps: int,
) -> StepLayout:
    """A layout on `old`'s slots and workers, counted from `per_step` as a build counts it;
    start and present released, as after `measure`."""
    return StepLayout(
        op_types=table.op_types,
        steps=steps,
        dp_ranks=old.dp_ranks,
        stages=old.stages,
        slot_stage=old.slot_stage,
        slot_type=slot_type,
        slot_seq=old.slot_seq,
        slot_chunk=old.slot_chunk,
        main_order=main_order,
        start=np.empty((0, 0, 0)),
        duration=duration,
        present=np.empty((0, 0, 0), dtype=bool),
        step_origin=step_origin,
        ranks=old.ranks,
        quality=quality_of(table, per_step, old.slot_stage, len(old.stages), dropped_steps),
        ends_at_last_op=table.ends_at_last_op,
        per_step=per_step,
    )


def _graph(layout: StepLayout) -> StepGraph | None:
    try:
        return build_graph(layout)
    except AnalysisError:
        return None


_NewSteps = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray
]


def _new_steps(rows: OpTable, dtype: np.dtype, old: StepLayout, names: list[str]) -> _NewSteps | None:
    """The new rows laid out on `old`'s slots: start, duration, present, steps, origins, rows per
    step, and the main-order sums; None when they do not fit `old`'s slots and workers."""
    try:
        block = build_layout(rows, dtype)
    except AnalysisError:
        return None
    q, per = block.quality, block.per_step
    if q.dropped_steps or q.invalid_rows or per is None:
        return None
    if not (
        np.array_equal(block.dp_ranks, old.dp_ranks)
        and np.array_equal(block.stages, old.stages)
        and np.array_equal(block.ranks, old.ranks)
    ):
        return None
    index = {(int(old.slot_stage[j]), names[j], int(old.slot_seq[j])): j for j in range(old.n_slots)}
    at = np.array(
        [
            index.get((int(block.slot_stage[j]), block.type_name(j), int(block.slot_seq[j])), -1)
            for j in range(block.n_slots)
        ],
        dtype=np.intp,
    )
    if (at < 0).any() or not np.array_equal(block.slot_chunk, old.slot_chunk[at]):
        return None
    n_slots, k, n_dp = old.n_slots, block.steps.size, old.dp_ranks.size
    start = np.full((n_slots, k, n_dp), np.nan, dtype=dtype)
    duration = np.zeros((n_slots, k, n_dp), dtype=dtype)
    present = np.zeros((n_slots, k, n_dp), dtype=bool)
    start[at], duration[at], present[at] = block.start, block.duration, block.present
    rel_sum = np.zeros((n_slots, k))
    rel_count = np.zeros((n_slots, k), dtype=np.int64)
    rel_sum[at], rel_count[at] = per.rel_sum, per.rel_count
    return start, duration, present, block.steps, block.step_origin, per.rows, rel_sum, rel_count


def _no_steps(n_slots: int, n_dp: int, dtype: np.dtype) -> _NewSteps:
    empty = np.empty((n_slots, 0, n_dp), dtype=dtype)
    return (
        empty,
        empty.copy(),
        np.zeros((n_slots, 0, n_dp), dtype=bool),
        np.empty(0, dtype=np.int64),
        np.empty(0),
        np.empty(0, dtype=np.int64),
        np.zeros((n_slots, 0)),
        np.zeros((n_slots, 0), dtype=np.int64),
    )
