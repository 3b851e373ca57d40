"""A GPU job's agents record only the blocks of steps their device clock times (agent
`smon.sampling`): the analysis of those steps must tell what the analysis of every step tells.

The same simulated job is analysed twice: every step, and only the steps `DeviceSampling` picks
(blocks of 4, one block in 4 or 8). S stays within 5% of the every-step figure and names the same
straggler, for a steady straggler and for one that comes and goes.
"""

from __future__ import annotations

import random

import pytest

from smon.sampling import DeviceSampling
from smon_server.columns import StepColumns
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.diagnosis import stragglers
from smon_server.whatif.engine import analyze
from smon_server.whatif.inputs.from_steps import build_op_table, complete_steps
from tests.whatif.step_records import DdpJob, StepRow, simulate

ROBUST = WhatIfConfig(estimator="robust")


def s_and_stragglers(rows: list[StepRow]) -> tuple[float, list[tuple[int, str]], int]:
    """S, the stragglers named, and how many steps the replay covered."""
    table = build_op_table(complete_steps(StepColumns.from_rows(rows)))
    result = analyze(table, config=ROBUST)
    named = [(int(result.worker_rank[s.dp_index, s.stage_index]), s.cause) for s in stragglers(table, result)]
    return result.slowdown, named, len(set(table.step.tolist()))


def _intermittent(seed: int, share: float, extra: float):
    rng = random.Random(seed)
    hits = {s for s in range(100_000) if rng.random() < share}
    return lambda r, s: extra if r == 1 and s in hits else 0.0


@pytest.mark.parametrize("period", [4, 8])
@pytest.mark.parametrize(
    "name, extra_forward",
    [
        ("steady", lambda r, s: 0.008 if r == 1 else 0.0),
        ("intermittent", _intermittent(seed=3, share=0.3, extra=0.020)),
    ],
)
def test_sampled_blocks_tell_what_every_step_tells(name: str, extra_forward, period: int) -> None:
    job = DdpJob(ranks=4, steps=1600, extra_forward=extra_forward)
    rows, _ = simulate(job)
    every_s, every_named, _ = s_and_stragglers(rows)
    sampling = DeviceSampling(period)
    sampled = [row for row in rows if sampling.timed(row.step)]
    assert len(sampled) < len(rows) / (period / 2)
    sampled_s, sampled_named, replayed = s_and_stragglers(sampled)
    # blocks of 4: the first step of each only lends its tail, the other three are replayed
    assert replayed >= 0.7 * len({row.step for row in sampled})
    assert every_s > 1.1
    assert sampled_s == pytest.approx(every_s, rel=0.05)
    assert sampled_named == every_named == [(1, "slow_worker")]


def test_ranks_at_two_periods_for_a_moment_are_analysed_on_the_steps_both_timed() -> None:
    """One rank samples at period 4, the others at 8: the server keeps the steps every worker
    reported, which are the period-8 blocks, and reads the same S."""
    rows, _ = simulate(DdpJob(ranks=4, steps=1600, extra_forward=lambda r, s: 0.008 if r == 2 else 0.0))
    fine, coarse = DeviceSampling(4), DeviceSampling(8)
    mixed = [row for row in rows if (fine if row.rank == 0 else coarse).timed(row.step)]
    only_coarse = [row for row in rows if coarse.timed(row.step)]
    assert len(mixed) > len(only_coarse)
    assert s_and_stragglers(mixed) == s_and_stragglers(only_coarse)
