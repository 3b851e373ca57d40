"""Joining op tables (whatif/inputs/merge.py): host times and op type numbers as one build gives,
and a sliding window extended in place equal to a build of its steps."""

from __future__ import annotations

import numpy as np

from smon_server.whatif.inputs import merge
from smon_server.whatif.inputs.merge import join_tables
from smon_server.whatif.inputs.step_table import StepTable
from smon_server.whatif.ops import OpTable


def _table(types: tuple[str, ...], codes: list[int], host: list[float] | None) -> OpTable:
    n = len(codes)
    ints = np.arange(n, dtype=np.int32)
    return OpTable(
        op_types=types,
        dp_rank=ints,
        stage=np.zeros(n, np.int32),
        step=np.arange(n, dtype=np.int64),
        op_type=np.array(codes, np.int32),
        seq_id=np.zeros(n, np.int32),
        chunk=np.zeros(n, np.int16),
        microbatch=np.full(n, -1, np.int16),
        start=np.arange(n, dtype=np.float64),
        duration=np.ones(n),
        rank=ints,
        host_duration=np.empty(0) if host is None else np.array(host),
    )


def test_join_keeps_host_times_only_where_some_part_has_them() -> None:
    plain = _table(("forward", "backward"), [0, 1], None)
    joined, _ = join_tables([(plain, []), (_table(("forward", "backward"), [1, 0], None), [])])
    assert joined.host_duration.size == 0
    assert joined.op_types == ("forward", "backward")
    assert joined.op_type.tolist() == [0, 1, 1, 0]
    timed = _table(("backward", "optimizer"), [0, 1], [0.5, np.nan])
    joined, _ = join_tables([(plain, []), (timed, [])])
    assert joined.op_types == ("forward", "backward", "optimizer")
    assert joined.op_type.tolist() == [0, 1, 1, 2]  # the second part renumbered onto the first's
    assert np.isnan(joined.host_duration[[0, 1, 3]]).all() and joined.host_duration[2] == 0.5
    untimed = _table(("forward",), [0], [np.nan])
    joined, _ = join_tables([(plain, []), (untimed, [])])
    assert joined.host_duration.size == 0  # NaN everywhere: none


def _steps(first: int, count: int, *, per_step: int = 4, salt: float = 0.0) -> StepTable:
    """A table of steps [first, first + count), every row a function of its step and worker, so
    tables of any ranges agree on the rows they share."""
    step = np.repeat(np.arange(first, first + count, dtype=np.int64), per_step)
    worker = np.tile(np.arange(per_step, dtype=np.int32), count)
    n = step.size
    ops = OpTable(
        op_types=("forward", "backward"),
        dp_rank=worker,
        stage=np.zeros(n, np.int32),
        step=step,
        op_type=(step % 2).astype(np.int32),
        seq_id=np.zeros(n, np.int32),
        chunk=np.zeros(n, np.int16),
        microbatch=np.full(n, -1, np.int16),
        start=step * 10.0 + worker,
        duration=1.0 + (step % 7) * 0.1 + worker * 0.01 + salt,
        rank=worker,
        host_duration=step * 0.5 + worker,
    )
    steps = np.arange(first, first + count, dtype=np.int64)
    return StepTable(
        ops=ops,
        labels=[],
        through=first + count - 1,
        times=np.column_stack([steps, steps * 10.0, steps * 10.0 + 9]).astype(np.float64),
        row_steps=steps,
        type_newest=np.array([max(s for s in steps if s % 2 == k) for k in (0, 1)]),  # op_type: step % 2
    )


def _columns(table: StepTable) -> dict[str, np.ndarray]:
    names = [name for name in OpTable.COLUMNS if name != "seq_sq"] + ["host_duration"]
    return {name: getattr(table.ops, name).copy() for name in names}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_sliding_window_appends_in_place_and_equals_a_build_of_its_steps() -> None:
    window, slide, table = 60, 3, _steps(0, 60)
    passes = in_place = 0
    for first in range(window, 300, slide):
        previous = table
        table = merge.trim(merge.extend(table, _steps(first, slide)), first + slide - window)
        assert _same(_columns(table), _columns(_steps(first + slide - window, window))), first
        passes += 1
        in_place += int(table.ops.duration.base is previous.ops.duration.base)
    # Most passes wrote after the kept rows: with room for a quarter of the window more, about
    # five slides of 3 steps a buffer; then the rows no longer fit and moved once.
    assert 0.7 * passes <= in_place < passes
    # The memory a table holds counts its columns' whole buffers.
    assert table.nbytes > sum(getattr(table.ops, n).nbytes for n in OpTable.COLUMNS)


def test_a_table_extended_twice_leaves_the_first_extension_alone() -> None:
    base = merge.extend(_steps(0, 30), _steps(30, 5))  # now in buffers with room
    first = merge.extend(base, _steps(35, 5))
    kept = _columns(first)
    second = merge.extend(base, _steps(35, 5, salt=1.0))  # the same table again: copied
    assert _same(_columns(first), kept)
    assert second.ops.duration.base is not first.ops.duration.base
    assert np.array_equal(second.ops.duration[-20:], _steps(35, 5, salt=1.0).ops.duration)
