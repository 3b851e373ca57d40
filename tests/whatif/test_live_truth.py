"""S against the truth on simulated DDP jobs built as step records (the live path's input).

The simulation knows how long the job would take without the injected work, so each test checks
that S predicts that speed-up, that every second of the step is replayed (discrepancy 1), and that
the rank doing the extra work is the only straggler, with its own cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from smon_server.columns import StepColumns
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.diagnosis import diagnose, stragglers
from smon_server.whatif.engine import analyze
from smon_server.whatif.inputs.from_steps import build_op_table
from tests.whatif.step_records import DdpJob, simulate

ROBUST = WhatIfConfig(estimator="robust")


def truth_and_summary(job: DdpJob, config: WhatIfConfig = ROBUST) -> tuple[float, float, dict, list]:
    rows, with_it = simulate(job)
    clean = dataclasses.replace(
        job,
        extra_forward=lambda r, s: 0.0,
        extra_data=lambda r, s: 0.0,
        untimed=lambda r, s: 0.0,
        eval_span=lambda r, s: 0.0,
        gc_pause=lambda r, s: 0.0,
    )
    _, without = simulate(clean)
    table = build_op_table(StepColumns.from_rows(rows))
    result = analyze(table, config=config)
    found = stragglers(table, result)
    found_json = [(int(result.worker_rank[s.dp_index, s.stage_index]), s.cause, s.evidence) for s in found]
    return (
        with_it / without,
        result.slowdown,
        {"result": result, "diagnoses": diagnose(table, result)},
        found_json,
    )


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_untimed_host_work_on_one_rank(ranks: int) -> None:
    job = DdpJob(ranks=ranks, untimed=lambda r, s: 0.050 if r == 1 else 0.0)
    truth, s, out, found = truth_and_summary(job)
    assert out["result"].discrepancy == pytest.approx(1.0, abs=1e-6)
    assert s == pytest.approx(truth, rel=0.02)
    assert [(rank, cause) for rank, cause, _ in found] == [(1, "host_work")]
    assert found[0][2]["op_type"] == "host"
    assert out["diagnoses"][0].cause == "host_work"
    assert "rank 1" in out["diagnoses"][0].recommendation


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_slow_forward_robust_vs_paper(ranks: int) -> None:
    job = DdpJob(ranks=ranks, extra_forward=lambda r, s: 0.030 if r == ranks - 1 else 0.0)
    truth, robust, _, found = truth_and_summary(job)
    _, paper, _, _ = truth_and_summary(job, WhatIfConfig(estimator="paper"))
    assert robust == pytest.approx(truth, rel=0.02)
    # The paper's mean keeps 1/ranks of the straggler in the ideal: below the truth.
    assert paper < truth - 0.5 * (truth - 1.0) / ranks
    assert [(rank, cause) for rank, cause, _ in found] == [(ranks - 1, "slow_worker")]


def test_rank0_periodic_evaluation_is_host_work() -> None:
    job = DdpJob(ranks=2, steps=60, eval_span=lambda r, s: 0.150 if r == 0 and s % 10 == 5 else 0.0)
    truth, s, out, found = truth_and_summary(job)
    assert out["result"].discrepancy == pytest.approx(1.0, abs=1e-6)
    assert s == pytest.approx(truth, rel=0.02)
    assert [(rank, cause) for rank, cause, _ in found] == [(0, "host_work")]
    assert found[0][2]["every_n_steps"] == 10
    assert out["diagnoses"][0].cause == "host_work"
    assert "every 10 steps" in out["diagnoses"][0].recommendation


def test_slow_data_loader_and_gc_name_their_rank() -> None:
    truth, s, _, found = truth_and_summary(DdpJob(ranks=4, extra_data=lambda r, s: 0.03 if r == 2 else 0.0))
    assert s == pytest.approx(truth, rel=0.02)
    assert [(rank, cause) for rank, cause, _ in found] == [(2, "data_loader")]
    truth, s, _, found = truth_and_summary(
        DdpJob(ranks=4, gc_pause=lambda r, s: 0.08 if r == 3 and s % 4 == 1 else 0.0)
    )
    assert s == pytest.approx(truth, rel=0.02)
    assert [(rank, cause) for rank, cause, _ in found] == [(3, "python_gc")]


def test_healthy_job_with_jitter_names_nobody() -> None:
    # ±1 ms of deterministic jitter on a 40 ms step: every rank is sometimes the slowest.
    job = DdpJob(ranks=4, jitter=lambda r, s: 0.001 * (((r * 7 + s * 3) % 5) - 2) / 2)
    truth, s, out, found = truth_and_summary(job)
    assert truth == 1.0
    assert s < 1.05
    assert found == []
    assert [d.cause for d in out["diagnoses"]] == []


def test_every_rank_equally_slow_is_not_a_straggler() -> None:
    """All ranks wait 20 ms outside the phases: job-wide host work, nobody to blame."""
    job = DdpJob(ranks=4, untimed=lambda r, s: 0.020)
    _, s, _, found = truth_and_summary(job)
    assert s == pytest.approx(1.0, abs=1e-6)
    assert found == []


def _gaussian(sd: float, seed: int = 7) -> Callable[[int, int], float]:
    """Independent per (rank, step) jitter, as a shared host gives: fixed by the seed."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, sd, size=(64, 1024))
    return lambda r, s: float(max(table[r, s], -0.009))


def test_ordinary_jitter_is_not_straggling() -> None:
    """Every step waits for whichever rank drew the longer forward: against a jitter-free ideal
    that alone reads as straggling; the healthy ideal keeps it, so S stays near 1."""
    job = DdpJob(ranks=2, steps=80, jitter=_gaussian(0.004))
    truth, s, out, found = truth_and_summary(job)
    result = out["result"]
    assert truth == 1.0
    assert result.replay_slowdown > 1.04  # the max-of-jitter effect is there ...
    assert result.noise_floor > 1.03
    assert s < 1.02  # ... and is not counted as straggling
    assert found == []
    assert out["diagnoses"] == []
    off = analyze(
        build_op_table(StepColumns.from_rows(simulate(job)[0])),
        config=WhatIfConfig(estimator="robust", jitter_sigmas=0),
    )
    assert off.slowdown == pytest.approx(result.replay_slowdown, rel=1e-9)
    assert off.noise_floor == pytest.approx(1.0)


@pytest.mark.parametrize("ranks", [2, 4])
def test_straggler_among_jitter_matches_truth(ranks: int) -> None:
    """The truth is the same jittery job without the straggler: S must not add the jitter. (The
    straggler stands out by 12 ms against per-step differences of sd 4 ms: beyond the 2-sigma
    noise gate, which a worker must pass to be left out of D* or named.)"""
    job = DdpJob(
        ranks=ranks,
        steps=80,
        jitter=_gaussian(0.003),
        extra_forward=lambda r, s: 0.012 if r == 1 else 0.0,
    )
    truth, s, out, found = truth_and_summary(job)
    assert truth > 1.1
    assert s == pytest.approx(truth, rel=0.03)
    assert out["result"].replay_slowdown > s  # the jitter-free frame overshoots
    assert [(rank, cause) for rank, cause, _ in found] == [(1, "slow_worker")]


def test_a_workers_bias_is_never_jitter() -> None:
    """Rank 1 is 3 ms slower in every forward (under the 10% tolerance, so it stays in D*): its
    bias over its peer is not ordinary jitter and still counts."""
    job = DdpJob(
        ranks=2, steps=80, jitter=_gaussian(0.001), extra_forward=lambda r, s: 0.003 if r == 1 else 0.0
    )
    truth, s, _, _ = truth_and_summary(job)
    assert truth > 1.03
    assert s == pytest.approx(truth, rel=0.02)


def test_varying_sequence_lengths_get_no_allowance() -> None:
    rows, _ = simulate(DdpJob(ranks=2, steps=30, jitter=_gaussian(0.004)))
    table = build_op_table(StepColumns.from_rows(rows))
    varied = dataclasses.replace(
        table, seq_sq=np.where(table.op_type == table.code("forward-compute"), 1.0 + table.step % 3, np.nan)
    )
    plain = analyze(table, config=ROBUST)
    lengths = analyze(varied, config=ROBUST)
    assert plain.noise_floor > 1.02
    assert lengths.prepared is not None and lengths.prepared.durations.jitter is not None
    forward = lengths.prepared.layout.slot_type == lengths.prepared.layout.op_types.index("forward-compute")
    assert not lengths.prepared.durations.jitter.cap[forward].any()
    assert lengths.slowdown > plain.slowdown


def test_pauses_that_take_turns_are_not_jitter() -> None:
    """Every rank pauses for GC on alternate steps, by turns (the paper's unsynchronised GC): no
    worker stands out on average, yet every step waits for a pause. An op that runs on some steps
    only is a pattern to idealise, not ordinary jitter: S is what synchronising the pauses buys
    (the same pauses, every rank on the same steps), as D* of `gc` is its cost per step."""
    turns = DdpJob(
        ranks=2, steps=80, jitter=_gaussian(0.001), gc_pause=lambda r, s: 0.030 if (s + r) % 2 == 0 else 0.0
    )
    together = dataclasses.replace(turns, gc_pause=lambda r, s: 0.030 if s % 2 == 0 else 0.0)
    rows, t_turns = simulate(turns)
    _, t_together = simulate(together)
    table = build_op_table(StepColumns.from_rows(rows))
    result = analyze(table, config=ROBUST)
    truth = t_turns / t_together
    assert truth > 1.2
    assert result.slowdown == pytest.approx(truth, rel=0.03)
    assert "python_gc" in [d.cause for d in diagnose(table, result)]
