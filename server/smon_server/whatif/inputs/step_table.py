"""A chunk of step records (StepColumns) converted into the op table of its complete steps, with
what lets tables of consecutive chunks be joined, extended and trimmed (whatif/inputs/merge.py)
into the table one build over all their steps would give, to the bit.

This module only converts: it reads no store and keeps nothing between calls. The live pass
(jobs/window_ops.py) hands it each chunk the store's reader yields (store/window_reader.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from smon_server.columns import StepColumns, dense_index
from smon_server.whatif.inputs.from_steps import build_labelled_op_table, complete_steps
from smon_server.whatif.ops import OpTable


@dataclass(eq=False)
class Tail:
    """A column's buffer with room after its rows (whatif/inputs/merge.py `extend`), and where the
    rows written to it end: only a table whose rows end there may write after them."""

    buffer: np.ndarray
    end: int


@dataclass(frozen=True)
class StepTable:
    """Ops of consecutive complete steps, and the facts that joining and trimming tables need."""

    ops: OpTable
    labels: list[tuple[str, int]]  # each host op seq_id's label (whatif/inputs/from_steps.py)
    through: int  # the newest complete step of the records converted: every step up to it is settled
    times: np.ndarray  # [steps, 3]: step, first start, last end
    # What the table would say had the skipped steps' ops been kept (so that trimming drops the
    # op types a full table would drop): the steps that have ops, and per op type its newest
    # step with an op (the minimum int64 for a type with none).
    row_steps: np.ndarray
    type_newest: np.ndarray
    # Per column, the buffer it is a view of where a later pass may append (empty: none).
    room: dict[str, Tail] = field(default_factory=dict, compare=False)

    @property
    def nbytes(self) -> int:
        """Memory the table holds, a column's whole buffer where it has room to grow."""
        held = 0
        for name in (*OpTable.COLUMNS, "host_duration"):
            column, tail = getattr(self.ops, name), self.room.get(name)
            held += int(
                tail.buffer.nbytes if tail is not None and column.base is tail.buffer else column.nbytes
            )
        return held + int(self.times.nbytes + self.row_steps.nbytes + self.type_newest.nbytes)


@dataclass(frozen=True)
class Converted:
    """What one chunk of records gave: where its complete steps begin, and their op table."""

    oldest: int | None  # the oldest complete step (None: no step is complete)
    table: StepTable | None  # None when nothing was built (no complete step, or none new)


def convert(
    records: StepColumns,
    workers: int,
    first: int | None,
    skip: Sequence[tuple[int, int]] = (),
    after: int | None = None,
) -> Converted:
    """The ops of the steps of `records` all `workers` workers reported, from step `first` on
    (earlier ones only lend their tail: steps are cut at their last collective), but those of
    steps in the `skip` ranges ([a, b): warm-up). `after`: the newest step already converted
    (the chunk before, or a kept table); nothing is built unless a complete step is newer."""
    complete = complete_steps(records, workers)
    if not len(complete):
        return Converted(None, None)
    oldest, newest = int(complete.step.min()), int(complete.step.max())
    if after is not None and newest <= after:
        return Converted(oldest, None)
    ops, labels = build_labelled_op_table(complete)
    times = _step_times(complete)
    keep = ops.step >= first if first is not None else np.ones(len(ops), dtype=bool)
    if first is not None:
        times = times[times[:, 0] >= first]
    row_steps, type_newest = _row_facts(ops, keep)
    for a, b in skip:
        keep &= (ops.step < a) | (ops.step >= b)
    if len(ops) > 1 and (ops.step[1:] < ops.step[:-1]).any():
        # In step order (the engine reads rows in any order): a kept window then sheds its oldest
        # steps as a view from the first row it keeps (merge.trim), not as a copy of the rest.
        order = np.argsort(ops.step, kind="stable")
        ops = ops.take(order[keep[order]])
    elif not keep.all():
        ops = ops.take(keep)
    table = StepTable(
        ops=ops, labels=labels, through=newest, times=times, row_steps=row_steps, type_newest=type_newest
    )
    return Converted(oldest, table)


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
