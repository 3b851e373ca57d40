"""The op table built from step records, case by case (the simulated jobs check S end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from smon_server.columns import StepColumns
from smon_server.whatif import ops as O
from smon_server.whatif.inputs.from_steps import build_op_table, complete_steps
from tests.whatif.step_records import StepRow


def row(
    rank: int, step: int, spans: list, *, start: float | None = None, duration: float = 1.0, tp: int = 0
) -> StepRow:
    return StepRow(
        rank=rank,
        step=step,
        dp_rank=rank,
        pp_rank=0,
        tp_rank=tp,
        start_time=100.0 + step if start is None else start,
        duration=duration,
        phases={},
        spans=spans,
    )


def ops_of(table, rank: int, step: int) -> list[tuple[str, float, float]]:
    mine = (table.rank == rank) & (table.step == step)
    return [
        (table.op_types[c], round(float(s), 6), round(float(d), 6))
        for c, s, d in zip(table.op_type[mine], table.start[mine], table.duration[mine], strict=True)
    ]


def test_nested_spans_are_carved_out_and_gaps_become_host_work() -> None:
    spans = [
        ["forward", 0.1, 0.4, -1, 0],
        ["gc", 0.2, 0.1, -1, 0],
        ["custom", 0.22, 0.05, -1, 0],
        ["backward", 0.6, 0.3, -1, 0],
    ]
    table = build_op_table(StepColumns.from_rows([row(0, 0, spans)]))
    assert ops_of(table, 0, 0) == [
        ("host", 100.0, 0.1),
        ("forward-compute", 100.1, 0.3),  # minus gc (and custom inside gc)
        ("gc", 100.2, 0.05),  # minus custom
        ("custom", 100.22, 0.05),
        ("host", 100.5, 0.1),
        ("backward-compute", 100.6, 0.3),
        ("host", 100.9, 0.1),  # the step's tail
    ]
    assert sum(d for _, _, d in ops_of(table, 0, 0)) == pytest.approx(1.0)


def test_overlapping_spans_that_do_not_nest_keep_their_own_time() -> None:
    spans = [["forward", 0.0, 0.5, -1, 0], ["gc", 0.4, 0.3, -1, 0]]
    table = build_op_table(StepColumns.from_rows([row(0, 0, spans)]))
    assert ops_of(table, 0, 0)[:2] == [("forward-compute", 100.0, 0.5), ("gc", 100.4, 0.3)]


def test_the_tail_after_the_last_collective_starts_the_next_step() -> None:
    step = [["forward", 0.0, 0.4, -1, 0], ["grad_sync", 0.4, 0.2, -1, 0], ["optimizer", 0.7, 0.2, -1, 0]]
    table = build_op_table(StepColumns.from_rows([row(0, s, step) for s in range(3)]))
    assert set(np.unique(table.step)) == {1, 2}  # step 0 only lends its tail
    assert ops_of(table, 0, 1) == [
        ("host", 100.6, 0.1),
        ("optimizer", 100.7, 0.2),
        ("host", 100.9, 0.1),
        ("forward-compute", 101.0, 0.4),
        ("grads-all-reduce", 101.4, 0.2),
    ]


def test_float32_offsets_do_not_move_ops_across_the_cut() -> None:
    """Spans end to end as the store gives them back (float32 offsets) on a 60 s step: the
    collective's rounded end lands 1.9 µs after the optimizer's rounded start."""
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    sync_start, sync, optimizer_start = f32(30.01), f32(59.3 - 30.01), f32(59.3)
    assert sync_start + sync > optimizer_start
    step: list[list[object]] = [["forward", 0.0, sync_start, -1, 0], ["grad_sync", sync_start, sync, -1, 0]]
    step.append(["optimizer", optimizer_start, f32(0.7), -1, 0])
    table = build_op_table(
        StepColumns.from_rows([row(0, s, step, start=1e9 + 60 * s, duration=60.0) for s in range(3)])
    )
    assert [name for name, _, _ in ops_of(table, 0, 1)] == [
        "optimizer",
        "forward-compute",
        "grads-all-reduce",
    ]


def test_only_the_lead_tensor_parallel_rank_and_complete_steps_are_kept() -> None:
    spans = [["forward", 0.0, 0.5, -1, 0]]
    rows = [row(0, s, spans) for s in range(3)] + [row(1, s, spans) for s in range(2)]
    rows += [
        StepRow(
            rank=9,
            step=s,
            dp_rank=0,
            pp_rank=0,
            tp_rank=1,
            start_time=100.0 + s,
            duration=1.0,
            phases={},
            spans=spans,
        )
        for s in range(3)
    ]
    cols = complete_steps(StepColumns.from_rows(rows))
    assert sorted(set(cols.step.tolist())) == [0, 1]  # rank 1 has not finished step 2
    table = build_op_table(cols)
    assert set(table.rank.tolist()) == {0, 1}
    assert O.HOST in table.op_types


@pytest.mark.parametrize("stride", [1, 32, 10**12])
def test_steps_numbered_apart_but_back_to_back_continue_each_other(stride: int) -> None:
    """A script numbering its steps by samples (or anything else) is analysed like one counting
    them: each record that began as its rank's previous one ended continues it."""
    from tests.whatif.step_records import DdpJob, simulate

    rows, _ = simulate(DdpJob(ranks=2, steps=12))
    renumbered = [StepRow(**{**r.__dict__, "step": r.step * stride}) for r in rows]
    plain = build_op_table(complete_steps(StepColumns.from_rows(rows)))
    spaced = build_op_table(complete_steps(StepColumns.from_rows(renumbered)))
    assert len(spaced) == len(plain) > 0
    assert sorted(set(spaced.step.tolist())) == [s * stride for s in sorted(set(plain.step.tolist()))]
    np.testing.assert_allclose(spaced.duration, plain.duration)


def test_a_gap_with_time_in_it_is_steps_not_recorded() -> None:
    """Steps numbered apart with steps' worth of time between them (dropped, or not sampled by the
    agent) do not continue: their window would hold the missing steps' time."""
    from tests.whatif.step_records import DdpJob, simulate

    rows, _ = simulate(DdpJob(ranks=2, steps=12))
    kept = [r for r in rows if r.step % 6 < 3]  # blocks of 3 recorded steps, 3 missing
    table = build_op_table(complete_steps(StepColumns.from_rows(kept)))
    # Each block's first step only lends its tail: steps 1, 2, 7, 8 are replayed.
    assert sorted(set(table.step.tolist())) == [1, 2, 7, 8]
