"""The newest steps alone name a straggler within seconds of its onset (summary `recent`)."""

from __future__ import annotations

import random

import pytest

from smon_server.columns import StepColumns
from smon_server.jobs.live import analyze_live, recent_stragglers
from smon_server.jobs.step_ranges import recent_from
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.inputs.from_steps import build_op_table
from tests.whatif.step_records import DdpJob, simulate

ROBUST = WhatIfConfig(estimator="robust")


def test_an_onset_is_named_in_recent_before_the_window_notices() -> None:
    job = DdpJob(ranks=4, steps=200, extra_forward=lambda r, s: 0.020 if r == 2 and s >= 190 else 0.0)
    table = build_op_table(StepColumns.from_rows(simulate(job)[0]))
    window = analyze_live(table, gpus=4, elapsed_hours=0.1, config=ROBUST)
    assert window.summary["stragglers"] == []  # 10 slow steps of 200 do not stand out
    recent = recent_stragglers(table, 190, config=ROBUST)
    assert recent is not None
    assert (recent["from_step"], recent["to_step"], recent["steps_seen"]) == (190, 199, 10)
    assert [s["rank"] for s in recent["stragglers"]] == [2]
    assert recent["stragglers"][0]["cause"] == "slow_worker"
    assert recent["slowdown"] > 1.3


def test_healthy_recent_steps_name_nobody() -> None:
    table = build_op_table(StepColumns.from_rows(simulate(DdpJob(ranks=4, steps=60))[0]))
    recent = recent_stragglers(table, 50, config=ROBUST)
    assert recent is not None and recent["stragglers"] == []
    assert recent_stragglers(table, 1000, config=ROBUST) is None  # no such steps


def test_recent_stretch_is_the_last_seconds_but_never_too_few_steps() -> None:
    times = [(s, 100.0 + s, 101.0 + s) for s in range(100)]  # one step a second
    assert recent_from(times, seconds=15, min_steps=5) == 84  # ended within 15 s of the newest
    assert recent_from(times, seconds=1, min_steps=5) == 95  # at least 5 steps
    slow = [(s, 100.0 + 30 * s, 130.0 + 30 * s) for s in range(100)]  # 30 s steps
    assert recent_from(slow, seconds=15, min_steps=5) == 95
    assert recent_from(times, seconds=500, min_steps=5) is None  # the whole window already
    assert recent_from(times[:5], seconds=15, min_steps=5) is None
    fast = [(s, 100.0 + 0.04 * s, 100.04 + 0.04 * s) for s in range(500)]  # 40 ms steps
    assert recent_from(fast, seconds=15, min_steps=5) in (124, 125)  # the newest ~375 steps
    assert recent_from(fast, seconds=15, min_steps=5, max_steps=50) == 450  # but at most 50
    assert recent_from(slow, seconds=15, min_steps=5, max_steps=50) == 95  # the minimum is kept
    assert recent_from(fast, seconds=15, min_steps=5, max_steps=2) == 495  # even over a smaller maximum


def _long_step_job(ranks: int, steps: int, extra: float, onset: int) -> DdpJob:
    """~8 s steps with ±50 ms jitter; from `onset` rank 1's forward takes `extra` s longer."""
    rng = random.Random(ranks)
    jitter = {(r, s): max(-0.1, rng.gauss(0, 0.05)) for r in range(ranks) for s in range(steps)}
    return DdpJob(
        ranks=ranks,
        steps=steps,
        data_wait=0.1,
        forward=2.5,
        backward=5.0,
        transfer=0.3,
        optimizer=0.2,
        extra_forward=lambda r, s: extra if r == 1 and s >= onset else 0.0,
        jitter=lambda r, s: jitter[(r, s)],
    )


@pytest.mark.parametrize("ranks", [4, 16])
def test_long_steps_name_an_onset_within_five_steps(ranks: int) -> None:
    """Issue 8: with steps longer than 6 s, a straggler is named within 5 steps of its onset.
    `recent` is then the newest SMON_RECENT_MIN_STEPS (5) steps; a rank 15% slower stands out
    there after at most 4 of them, and the next pass (every 10 s: about one step) reports it."""
    onset, first_named = 60, None
    for slow_steps in range(1, 6):
        table = build_op_table(
            StepColumns.from_rows(simulate(_long_step_job(ranks, onset + slow_steps, 1.2, onset))[0])
        )
        recent = recent_stragglers(table, onset + slow_steps - 5, config=ROBUST)
        assert recent is not None
        if [s["rank"] for s in recent["stragglers"]] == [1]:
            first_named = slow_steps
            break
        assert recent["stragglers"] == []  # nobody else named meanwhile
    assert first_named is not None and first_named <= 4


@pytest.mark.parametrize("ranks", [4, 16])
def test_long_healthy_steps_name_nobody_in_any_recent_stretch(ranks: int) -> None:
    table = build_op_table(StepColumns.from_rows(simulate(_long_step_job(ranks, 70, 0.0, 0))[0]))
    for newest in range(10, 70, 3):
        stretch = table.take((table.step > newest - 5) & (table.step <= newest))  # 5 steps, as live
        recent = recent_stragglers(stretch, newest - 4, config=ROBUST)
        assert recent is not None and recent["steps_seen"] == 5, newest
        assert recent["stragglers"] == [], newest
