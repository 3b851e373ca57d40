"""The fast replay against the plain per-op reference simulator, on random jobs and a real trace."""

from __future__ import annotations

import numpy as np
import pytest

from smon_server.whatif.engine import WhatIfConfig, WhatIfResult, analyze
from smon_server.whatif.inputs.trace import load_trace
from smon_server.whatif.ops import OpTable
from tests.support.synthetic import SyntheticJob, synthetic_table
from tests.whatif.conftest import require_conformance
from tests.whatif.reference import reference_analysis


def random_job(seed: int) -> SyntheticJob:
    rng = np.random.default_rng(seed)
    dp, pp = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    slow = {(int(rng.integers(0, dp)), int(rng.integers(0, pp))): 1.0 + float(rng.random())}
    interleaved = pp > 1 and rng.random() < 0.4  # Megatron's interleaving: mb a multiple of pp
    return SyntheticJob(
        dp=dp,
        pp=pp,
        vpp=int(rng.integers(2, 4)) if interleaved else 1,
        microbatches=pp * int(rng.integers(1, 3)) if interleaved else int(rng.integers(1, 7)),
        steps=int(rng.integers(1, 5)),
        jitter=0.3,
        launch_gap=0.002 * float(rng.random()),
        slow_workers=slow,
        slow_data={(0, 0): 0.01} if rng.random() < 0.3 else {},
        # The reference has no notion of absent ops, so gc runs on every step here when enabled
        # (test_ragged covers occasional gc by hand).
        gc_probability=1.0 if rng.random() < 0.3 else 0.0,
        gc_seconds=0.02,
        seed=seed,
    )


def assert_same(fast: WhatIfResult, ref: dict, tol: float) -> None:
    assert fast.slowdown == pytest.approx(ref["slowdown"], rel=tol)
    assert fast.discrepancy == pytest.approx(ref["discrepancy"], rel=tol)
    assert fast.ideal_step_time == pytest.approx(ref["ideal_step_time"], rel=tol)
    step_time = dict(zip(fast.steps.tolist(), fast.step_time.tolist(), strict=True))
    for step, t in ref["step_time"].items():
        assert step_time[step] == pytest.approx(t, rel=tol)
    for name, value in ref["ideal_by_type"].items():
        assert fast.ideal_durations[name] == pytest.approx(value, rel=tol, abs=1e-12)
    a = fast.attribution
    assert a is not None
    for kind, ours, per_step in (
        ("by_op_type", fast.by_op_type, fast.per_step("op_type")),
        ("by_dp_rank", fast.by_dp_rank, fast.per_step("dp_rank")),
        ("by_stage", fast.by_stage, fast.per_step("stage")),
    ):
        assert set(ours) == set(ref[kind])
        for key, (value, steps) in ref[kind].items():
            assert ours[key] == pytest.approx(value, rel=tol), (kind, key)
            for step, v in steps.items():
                assert per_step[step][key] == pytest.approx(v, rel=tol), (kind, key, step)
    assert list(a.top_workers) == ref["top_workers"]
    np.testing.assert_allclose([a.m_w, a.m_s], [ref["m_w"], ref["m_s"]], rtol=tol, atol=1e-9)


@pytest.mark.parametrize("seed", range(16))
def test_random_jobs_match_the_reference(seed: int) -> None:
    t = synthetic_table(random_job(seed))
    assert_same(analyze(t, config=WhatIfConfig(force_attribution=True)), reference_analysis(t), 1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_row_order_does_not_matter(seed: int) -> None:
    t = synthetic_table(random_job(100 + seed))
    shuffled = t.take(np.random.default_rng(seed).permutation(len(t)))
    a = analyze(t, config=WhatIfConfig(force_attribution=True))
    b = analyze(shuffled, config=WhatIfConfig(force_attribution=True))
    # Equal up to summation order in the D* means.
    assert b.slowdown == pytest.approx(a.slowdown, rel=1e-12)
    for mine, theirs in ((a.by_dp_rank, b.by_dp_rank), (a.by_op_type, b.by_op_type)):
        assert theirs == pytest.approx(mine, rel=1e-12)
    np.testing.assert_allclose(b.step_time, a.step_time, rtol=1e-12)


def test_single_precision_and_threads_agree_with_double() -> None:
    t = synthetic_table(random_job(7))
    exact = analyze(t, config=WhatIfConfig(force_attribution=True, precision="double"))
    approx = analyze(t, config=WhatIfConfig(force_attribution=True, precision="single", threads=2))
    assert approx.slowdown == pytest.approx(exact.slowdown, rel=1e-5)
    for key, value in exact.by_dp_rank.items():
        assert approx.by_dp_rank[key] == pytest.approx(value, rel=1e-5)


def test_chunked_replay_matches_one_batch() -> None:
    """A tiny memory budget forces the variant / step chunking; results must not change."""
    t = synthetic_table(
        SyntheticJob(dp=8, pp=2, microbatches=4, steps=6, jitter=0.3, slow_workers={(3, 1): 1.5})
    )
    whole = analyze(t, config=WhatIfConfig(force_attribution=True))
    pieces = analyze(t, config=WhatIfConfig(force_attribution=True, memory_budget=1))
    np.testing.assert_array_equal(pieces.step_time, whole.step_time)
    assert pieces.by_op_type == pytest.approx(whole.by_op_type, rel=1e-12)
    assert pieces.by_stage == pytest.approx(whole.by_stage, rel=1e-12)
    assert pieces.attribution is not None and whole.attribution is not None
    np.testing.assert_allclose(pieces.attribution.dp_step, whole.attribution.dp_step)


def test_real_trace_matches_the_reference() -> None:
    d = require_conformance()
    t: OpTable = load_trace(d / "trace-ST.parquet").table
    assert_same(analyze(t), reference_analysis(t), 1e-9)


@pytest.mark.parametrize(("pp", "vpp", "mb"), [(3, 1, 5), (4, 2, 8), (2, 3, 4)])
def test_generated_timeline_replays_exactly(pp: int, vpp: int, mb: int) -> None:
    """With no launch gaps the generator's own clock is the replay: T_trace == T(D)."""
    t = synthetic_table(SyntheticJob(dp=3, pp=pp, vpp=vpp, microbatches=mb, steps=3, jitter=0.4, seed=3))
    r = analyze(t)
    np.testing.assert_allclose(r.trace_step_time, r.step_time, rtol=1e-12)
    assert r.quality.reordered_instances == 0
