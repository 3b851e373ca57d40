"""Cases small enough to work out by hand: the engine must give exactly the math of DESIGN §5."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smon_server.whatif.engine import WhatIfConfig, analyze
from tests.support.synthetic import SyntheticJob, synthetic_table
from tests.whatif.builders import Op, data_parallel_step, table

F, B, T, OPT = 0.10, 0.20, 0.03, 0.02  # forward, backward, all-reduce transfer, optimizer


@pytest.mark.parametrize(("n", "k"), [(2, 2.0), (4, 3.0), (8, 1.5), (16, 1.2)])
def test_one_slow_forward_gives_the_exact_slowdown(n: int, k: float) -> None:
    forward = [F] * n
    forward[1] = k * F
    ops = [
        o
        for s in range(3)
        for o in data_parallel_step(s, forward, backward=B, transfer=T, optimizer=OPT, origin=10.0 * s)
    ]
    r = analyze(table(ops))
    mean_forward = (n - 1 + k) * F / n
    expected = (k * F + B + T + OPT) / (mean_forward + B + T + OPT)
    assert r.slowdown == pytest.approx(expected, rel=1e-12)
    assert r.step_slowdown == pytest.approx([expected] * 3, rel=1e-12)
    assert r.discrepancy == pytest.approx(1.0, rel=1e-12)
    assert r.waste_fraction == pytest.approx(1 - 1 / expected, rel=1e-12)

    a = r.attribution
    assert a is not None
    assert max(r.by_dp_rank, key=lambda d: r.by_dp_rank[d]) == 1
    # Restoring the slow rank alone reproduces the measured job; any other rank changes nothing.
    assert r.by_dp_rank[1] == pytest.approx(expected, rel=1e-12)
    assert r.by_dp_rank[0] == pytest.approx(1.0, rel=1e-12)
    assert r.by_op_type["forward-compute"] == pytest.approx(expected, rel=1e-12)
    assert r.by_op_type["backward-compute"] == pytest.approx(1.0, rel=1e-12)
    assert a.top_workers[0] == (1, 0)
    assert a.m_w == pytest.approx(1.0, rel=1e-9)  # idealising the one slow worker removes it all


def test_no_straggler_is_exactly_one() -> None:
    ops = [
        o
        for s in range(4)
        for o in data_parallel_step(s, [F] * 4, backward=B, transfer=T, optimizer=OPT, origin=5.0 * s)
    ]
    r = analyze(table(ops))
    assert r.slowdown == pytest.approx(1.0, abs=1e-12)
    assert r.waste_fraction == pytest.approx(0.0, abs=1e-12)
    assert r.attribution is None  # below the 1.03 threshold
    assert r.by_op_type == {} and r.by_dp_rank == {}


def test_gpu_hours_wasted() -> None:
    forward = [F, 2 * F]
    ops = data_parallel_step(0, forward, backward=B, transfer=T, optimizer=OPT)
    r = analyze(table(ops), gpus=16, elapsed_hours=10.0)
    assert r.gpu_hours_wasted == pytest.approx(r.waste_fraction * 16 * 10.0)


def _two_stage_1f1b(f: float, b: float, p: float, o: float, delay: float = 0.0) -> list[Op]:
    """pp=2, 2 micro-batches, 1F1B, recorded with no launch delay (f, b >= p). By hand:
    stage 0 runs F0 [0, f], F1 [f, 2f]; F0's activation reaches stage 1 at f + p, which runs F0,
    B0 [2f+p, 2f+p+b] and sends B0's gradient (arrives 2f+2p+b, stage 0 runs B0 until
    2f+2p+2b); stage 1 runs F1, B1 until 3f+p+2b and sends B1's gradient (arrives 3f+2p+2b);
    stage 0 runs B1 and the optimizer: T = 3f + 3b + 2p + o.
    `delay` is untraced launch delay added before stage 0's second backward."""
    s0, s1 = 0, 1
    rows = [
        # stage 0: F0, F1, B0, B1 (warm-up 1, steady F1/B0, cool-down B1)
        Op(0, s0, 0, "forward-compute", 0, 0.0, f, 0),
        Op(0, s0, 0, "forward-send", 0, f, p),
        Op(0, s0, 0, "forward-compute", 1, f, f, 1),
        Op(0, s0, 0, "forward-send", 1, 2 * f, p + p),  # waits for stage 1 to post its recv
        Op(0, s0, 0, "backward-recv", 0, 2 * f, 2 * p + b),
        Op(0, s0, 0, "backward-compute", 0, 2 * f + 2 * p + b, b, 0),
        Op(0, s0, 0, "backward-recv", 1, 2 * f + 2 * p + 2 * b, f),  # until stage 1 sends B1's grad
        Op(0, s0, 0, "backward-compute", 1, 3 * f + 2 * p + 2 * b + delay, b, 1),
        Op(0, s0, 0, "optimizer", 0, 3 * f + 2 * p + 3 * b + delay, o),
        # stage 1: F0, B0, F1, B1
        Op(0, s1, 0, "forward-recv", 0, 0.0, f + p),
        Op(0, s1, 0, "forward-compute", 0, f + p, f, 0),
        Op(0, s1, 0, "backward-compute", 0, 2 * f + p, b, 0),
        Op(0, s1, 0, "backward-send", 0, 2 * f + p + b, p),
        Op(0, s1, 0, "forward-recv", 1, 2 * f + p, p),
        Op(0, s1, 0, "forward-compute", 1, 2 * f + p + b, f, 1),
        Op(0, s1, 0, "backward-compute", 1, 3 * f + p + b, b, 1),
        Op(0, s1, 0, "backward-send", 1, 3 * f + p + 2 * b, p),
        Op(0, s1, 0, "optimizer", 0, 3 * f + p + 2 * b, o),
    ]
    return rows


@pytest.mark.parametrize(("f", "b"), [(0.10, 0.20), (0.30, 0.10)])
def test_two_stage_pipeline_hand_schedule(f: float, b: float) -> None:
    p, o = 0.01, 0.02
    r = analyze(table(_two_stage_1f1b(f, b, p, o)))
    assert r.step_time[0] == pytest.approx(3 * f + 3 * b + 2 * p + o, rel=1e-12)
    assert r.slowdown == pytest.approx(1.0, abs=1e-12)  # equal durations: nothing to idealise
    assert r.discrepancy == pytest.approx(1.0, rel=1e-12)
    assert r.quality.reordered_instances == 0


def test_launch_delay_is_removed_and_reported() -> None:
    f, b, p, o, delay = 0.10, 0.20, 0.01, 0.02, 0.05
    r = analyze(table(_two_stage_1f1b(f, b, p, o, delay=delay)))
    t = 3 * f + 3 * b + 2 * p + o
    assert r.step_time[0] == pytest.approx(t, rel=1e-12)
    assert r.trace_step_time[0] == pytest.approx(t + delay, rel=1e-12)
    assert r.discrepancy == pytest.approx((t + delay) / t, rel=1e-12)
    assert r.discrepancy_flagged == ((t + delay) / t - 1 > 0.05)


def test_slow_last_stage_gives_large_m_s() -> None:
    job = SyntheticJob(dp=4, pp=4, microbatches=8, steps=4, stage_factor=(1.0, 1.0, 1.0, 2.0), jitter=0.01)
    r = analyze(synthetic_table(job))
    a = r.attribution
    assert a is not None
    assert a.m_s > 0.7
    assert a.m_w < 0.3
    assert max(r.by_stage, key=lambda s: r.by_stage[s]) == 3


def test_force_attribution_below_threshold() -> None:
    ops = [
        o
        for s in range(2)
        for o in data_parallel_step(s, [F, F * 1.01], backward=B, transfer=T, optimizer=OPT, origin=3.0 * s)
    ]
    r = analyze(table(ops), config=WhatIfConfig(force_attribution=True))
    assert r.slowdown < 1.03
    assert r.attribution is not None
    assert set(r.by_dp_rank) == {0, 1}
    assert math.isfinite(r.attribution.m_w)
    assert np.all(r.attribution.worker >= 0.99)
