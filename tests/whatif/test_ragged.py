"""Ragged and odd input: incomplete steps, absent ops, one worker, one step, duplicates, errors."""

from __future__ import annotations

import numpy as np
import pytest

from smon_server.whatif.engine import WhatIfConfig, analyze
from smon_server.whatif.layout import AnalysisError
from tests.whatif.builders import Op, data_parallel_step, table

F, B, T, OPT = 0.10, 0.20, 0.03, 0.02


def dp_steps(n_steps: int, forward: list[float]) -> list[Op]:
    return [
        o
        for s in range(n_steps)
        for o in data_parallel_step(s, forward, backward=B, transfer=T, optimizer=OPT, origin=10.0 * s)
    ]


def test_step_missing_on_a_worker_is_dropped_and_counted() -> None:
    full = dp_steps(4, [F, 1.5 * F, F])
    partial = [o for o in full if not (o.step == 3 and o.dp == 2)]
    r = analyze(table(partial))
    assert r.quality.dropped_steps == 1
    assert r.steps.tolist() == [0, 1, 2]
    reference = analyze(table([o for o in full if o.step < 3]))
    assert r.slowdown == pytest.approx(reference.slowdown, rel=1e-12)
    assert r.quality.rows_used == 3 * 3 * 4  # three complete steps of three ranks x four ops


def test_step_on_a_single_worker_only_is_dropped() -> None:
    ops = [*dp_steps(2, [F, F]), Op(0, 0, 7, "forward-compute", 0, 99.0, F)]
    r = analyze(table(ops))
    assert r.quality.dropped_steps == 1
    assert r.steps.tolist() == [0, 1]


def test_occasional_gc_is_an_absent_op_with_average_ideal_cost() -> None:
    g = 0.08
    ops = []
    for s in range(2):
        joins = [F + B + (g if (s, dp) == (0, 1) else 0.0) for dp in range(2)]
        done = max(joins) + T
        for dp in range(2):
            o = 10.0 * s
            extra = g if (s, dp) == (0, 1) else 0.0
            ops += [Op(dp, 0, s, "forward-compute", 0, o, F)]
            if extra:
                ops += [Op(dp, 0, s, "gc", 0, o + F, g)]
            ops += [
                Op(dp, 0, s, "backward-compute", 0, o + F + extra, B),
                Op(dp, 0, s, "grads-all-reduce", 0, o + joins[dp], done - joins[dp]),
                Op(dp, 0, s, "optimizer", 0, o + done, OPT),
            ]
    r = analyze(table(ops), config=WhatIfConfig(force_attribution=True))
    assert r.quality.absent_ops == 3
    ideal = F + g / 4 + B + T + OPT  # gc's D*: its mean over all four (step, rank) instances
    assert r.ideal_durations["gc"] == pytest.approx(g / 4)
    assert r.ideal_step_time == pytest.approx(ideal, rel=1e-12)
    assert r.step_time.tolist() == pytest.approx([F + g + B + T + OPT, F + B + T + OPT], rel=1e-12)
    assert r.slowdown == pytest.approx((F + g / 2 + B + T + OPT) / ideal, rel=1e-12)
    assert r.by_dp_rank[1] > r.by_dp_rank[0]


def test_single_worker_has_no_slowdown_to_explain() -> None:
    ops = dp_steps(5, [F])
    # Vary the one worker's forward from step to step: the mean is its own average.
    ops = [
        Op(
            o.dp,
            o.stage,
            o.step,
            o.op,
            o.seq,
            o.start,
            o.duration * (1 + 0.1 * o.step) if o.op == "optimizer" else o.duration,
        )
        for o in ops
    ]
    r = analyze(table(ops))
    assert r.slowdown == pytest.approx(1.0, rel=1e-12)
    assert len(r.dp_ranks) == 1 and len(r.stages) == 1


def test_single_step() -> None:
    r = analyze(table(dp_steps(1, [F, 2 * F, F, F])))
    assert r.steps.tolist() == [0]
    assert r.slowdown > 1.03
    assert max(r.by_dp_rank, key=lambda d: r.by_dp_rank[d]) == 1


def test_duplicate_rows_are_counted_once() -> None:
    ops = dp_steps(2, [F, F])
    r = analyze(table([*ops, ops[0], ops[5]]))
    assert r.quality.duplicate_ops == 2
    assert r.slowdown == pytest.approx(1.0, abs=1e-12)


def test_custom_phases_run_on_the_worker_stream() -> None:
    ops = []
    for s in range(2):
        for dp in range(2):
            h2d = 0.05 if dp == 1 else 0.01
            o = 10.0 * s
            joins = [0.01 + F + B, 0.05 + F + B]
            ops += [
                Op(dp, 0, s, "h2d", 0, o, h2d),
                Op(dp, 0, s, "forward-compute", 0, o + h2d, F),
                Op(dp, 0, s, "backward-compute", 0, o + h2d + F, B),
                Op(dp, 0, s, "grads-all-reduce", 0, o + joins[dp], max(joins) + T - joins[dp]),
            ]
    r = analyze(table(ops))
    assert r.ideal_durations["h2d"] == pytest.approx(0.03)
    assert r.slowdown == pytest.approx((0.05 + F + B + T) / (0.03 + F + B + T), rel=1e-12)
    assert set(r.by_op_type) == {"h2d", "forward-compute", "backward-compute", "grads-all-reduce"}
    assert r.by_op_type["h2d"] == pytest.approx(r.slowdown, rel=1e-12)


def test_bad_tables_raise_clear_errors() -> None:
    empty = table(dp_steps(1, [F])).take(np.zeros(4, dtype=bool))
    with pytest.raises(AnalysisError, match="empty"):
        analyze(empty)
    negative = [Op(0, 0, 0, "forward-compute", -1, 0.0, F)]
    with pytest.raises(AnalysisError, match="negative"):
        analyze(table(negative))


def test_rare_op_missed_by_the_discovery_sample_is_still_laid_out() -> None:
    """Large tables find their steps and slots from a sample of rows; a row the sample skipped
    must send the layout back to read every row."""
    from dataclasses import replace

    from tests.support.synthetic import SyntheticJob, synthetic_table

    t = synthetic_table(SyntheticJob(dp=64, pp=4, microbatches=16, steps=30))
    assert len(t) > 1 << 19  # so the sample strides over rows
    rare = (len(t) // 2) | 1  # an odd row: never on the sample's even stride
    names = (*t.op_types, "profiler-dump")
    op_type = t.op_type.copy()
    op_type[rare] = len(names) - 1
    r = analyze(replace(t, op_types=names, op_type=op_type))
    assert "profiler-dump" in r.ideal_durations
    # The new slot lacks all but one of its 30 x 64 instances; the op the row was is absent once.
    assert r.quality.absent_ops == 30 * 64


def test_sparse_step_numbers() -> None:
    ops = [o for o in dp_steps(2, [F, 2 * F])]
    ops = [Op(o.dp, o.stage, o.step * 10**9, o.op, o.seq, o.start, o.duration) for o in ops]
    r = analyze(table(ops))
    assert r.steps.tolist() == [0, 10**9]
    assert r.slowdown > 1.03


def test_clock_offsets_are_recovered_from_shared_ends() -> None:
    from dataclasses import replace

    from smon_server.whatif.clock import estimate_offsets
    from tests.support.synthetic import SyntheticJob, synthetic_table

    dp, pp = 4, 3
    t = synthetic_table(SyntheticJob(dp=dp, pp=pp, microbatches=4, steps=6, slow_workers={(1, 1): 1.4}))
    skew = np.random.default_rng(0).normal(0.0, 0.005, (dp, pp))
    skewed = replace(t, start=t.start + skew[t.dp_rank, t.stage])
    offsets = estimate_offsets(skewed)
    found = np.array([[offsets[(d, s)] for s in range(pp)] for d in range(dp)])
    np.testing.assert_allclose(found - found.mean(), skew - skew.mean(), atol=3e-4)

    truth = analyze(t).slowdown
    assert abs(analyze(skewed).slowdown - truth) > 0.02  # skew corrupts transfer vs waiting
    aligned = analyze(skewed, config=WhatIfConfig(align_clocks=True))
    assert aligned.slowdown == pytest.approx(truth, rel=2e-3)
    assert aligned.clock_offsets is not None and len(aligned.clock_offsets) == dp * pp


def test_invalid_rows_are_dropped_and_counted() -> None:
    ops = dp_steps(2, [F, 2 * F])
    bad = [
        Op(0, 0, 0, "data_wait", 0, float("nan"), 0.01),
        Op(1, 0, 0, "data_wait", 0, 0.0, -0.01),
        Op(0, 0, 1, "data_wait", 0, 10.0, float("inf")),
    ]
    r = analyze(table([*ops, *bad]))
    assert r.quality.invalid_rows == 3
    assert r.slowdown == pytest.approx(analyze(table(ops)).slowdown, rel=1e-12)
