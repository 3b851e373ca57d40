"""Each cause on a synthetic job built to have it (and only it), plus the signals-driven ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smon_server.jobs.live import analyze_live
from smon_server.whatif.diagnosis import Diagnosis, diagnose
from smon_server.whatif.diagnosis.base import DiagnosisConfig
from smon_server.whatif.engine import analyze
from smon_server.whatif.ops import OpTable
from smon_server.whatif.signals import GpuHealth, HangState, RankPosition, Signals
from tests.support.synthetic import SyntheticJob, synthetic_table


def run(job: SyntheticJob, signals: Signals | None = None, table: OpTable | None = None) -> list[Diagnosis]:
    t = table if table is not None else synthetic_table(job)
    found = diagnose(t, analyze(t), signals)
    for d in found:
        assert 0.0 <= d.share <= 1.0 and 0.0 <= d.confidence <= 1.0
        assert isinstance(d.evidence, dict) and d.recommendation
        json.dumps(d.to_json(), allow_nan=False)
    assert [d.share for d in found] == sorted((d.share for d in found), reverse=True)
    return found


def causes(found: list[Diagnosis]) -> list[str]:
    return [d.cause for d in found]


def test_healthy_job_has_no_diagnosis() -> None:
    assert run(SyntheticJob(dp=8, pp=2, microbatches=4, steps=10, jitter=0.01)) == []


def test_slow_data_loader() -> None:
    found = run(SyntheticJob(dp=8, steps=20, slow_data={(2, 0): 0.02}))
    assert causes(found)[0] == "data_loader"
    assert found[0].evidence["workers"][0]["dp_rank"] == 2
    assert found[0].workers[0] == (2, 0)
    assert "data loader" in found[0].recommendation


def test_python_gc() -> None:
    found = run(SyntheticJob(dp=8, steps=40, gc_probability=0.1, gc_seconds=0.03, seed=1))
    assert causes(found)[0] == "python_gc"
    assert "gc.freeze()" in found[0].recommendation
    assert found[0].evidence["slowdown_steps_with_gc"] > found[0].evidence["slowdown_steps_without_gc"]


def test_checkpoint_io_at_a_fixed_interval() -> None:
    found = run(SyntheticJob(dp=4, steps=30, checkpoint_every=5, checkpoint_seconds=0.2, jitter=0.01))
    assert "checkpoint_io" in causes(found)
    d = found[causes(found).index("checkpoint_io")]
    assert d.evidence["interval_steps"] == 5
    assert d.evidence["checkpoints"] == 6
    assert d.confidence >= 0.9


def test_communication() -> None:
    found = run(SyntheticJob(dp=8, steps=10, grad_sync=0.01, slow_links={(3, 0): 5.0}))
    assert causes(found)[0] == "communication"
    assert found[0].evidence["worst_worker"]["dp_rank"] == 3
    assert "NIC" in found[0].recommendation


SLOW = SyntheticJob(dp=8, pp=2, microbatches=4, steps=10, slow_workers={(5, 1): 1.6}, jitter=0.02)
SLOW_RANK = 1 * 8 + 5  # synthetic ranks are stage * dp + dp rank


def test_slow_worker_with_healthy_gpu() -> None:
    health = {
        r: GpuHealth(samples=60, throttled_fraction=0.0, sm_clock_ratio=1.0, ecc_uncorrected=0, xid_events=0)
        for r in range(16)
    }
    found = run(SLOW, Signals(gpu=health, hosts={SLOW_RANK: "node-7"}))
    assert causes(found)[0] == "slow_worker"
    assert found[0].ranks == (SLOW_RANK,)
    assert found[0].evidence["workers"][0]["host"] == "node-7"
    assert "no throttling" in found[0].recommendation and "node-7" in found[0].recommendation


def test_throttled_gpu_is_gpu_throttling() -> None:
    health = {
        r: GpuHealth(samples=60, throttled_fraction=0.0, sm_clock_ratio=1.0, ecc_uncorrected=0, xid_events=0)
        for r in range(16)
    }
    health[SLOW_RANK] = GpuHealth(
        samples=60, throttled_fraction=0.7, sm_clock_ratio=0.72, ecc_uncorrected=0, xid_events=0
    )
    found = run(SLOW, Signals(gpu=health))
    assert causes(found)[0] == "gpu_throttling"
    assert "slow_worker" not in causes(found)
    assert found[0].evidence["gpu"][str(SLOW_RANK)]["throttled_fraction"] == pytest.approx(0.7)
    assert "72%" in found[0].recommendation


def test_stage_imbalance() -> None:
    found = run(SyntheticJob(dp=4, pp=4, microbatches=8, steps=6, stage_factor=(1, 1, 1, 1.8), jitter=0.02))
    assert causes(found)[0] == "stage_imbalance"
    assert found[0].evidence["stage"] == 3
    assert "--decoder-last-pipeline-num-layers" in found[0].recommendation


SEQ = SyntheticJob(dp=8, pp=2, microbatches=8, steps=12, seq_spread=0.5, jitter=0.02, seed=4)


def test_sequence_imbalance_from_lengths() -> None:
    found = run(SEQ)
    assert causes(found)[0] == "sequence_imbalance"
    assert found[0].evidence["seq_sq_correlation"] >= 0.9
    assert found[0].confidence >= 0.7


def test_sequence_imbalance_from_timing_alone() -> None:
    t = synthetic_table(SEQ)
    no_lengths = OpTable(**{**t.__dict__, "seq_sq": np.empty(0)})
    found = run(SEQ, table=no_lengths)
    assert causes(found)[0] == "sequence_imbalance"
    assert "seq_sq_correlation" not in found[0].evidence
    assert "record_batch" in found[0].recommendation


def test_lengths_that_do_not_explain_compute_rule_it_out() -> None:
    t = synthetic_table(SEQ)
    shuffled = OpTable(**{**t.__dict__, "seq_sq": np.random.default_rng(0).permutation(t.seq_sq)})
    assert "sequence_imbalance" not in causes(run(SEQ, table=shuffled))


HUNG = HangState(
    stalled=True,
    seconds_since_step=300.0,
    positions=tuple(
        RankPosition(rank=r, step=812, phase="forward" if r == 2 else "grad_sync", host=f"node-{r}")
        for r in range(4)
    ),
)


def test_hang_names_the_odd_rank_out() -> None:
    found = diagnose(None, None, Signals(hang=HUNG))
    assert causes(found) == ["hang"]
    assert found[0].ranks == (2,)
    assert found[0].evidence["suspect_ranks"] == "2"
    assert "node-2" in found[0].recommendation and "py-spy" in found[0].recommendation


def test_hang_goes_first_and_a_short_pause_is_no_hang() -> None:
    found = run(SLOW, Signals(hang=HUNG))
    assert causes(found)[0] == "hang"
    brief = HangState(stalled=True, seconds_since_step=10.0, threshold_seconds=120.0)
    assert diagnose(None, None, Signals(hang=brief)) == []


def test_behind_rank_is_the_suspect() -> None:
    positions = tuple(RankPosition(rank=r, step=40 if r == 5 else 41, phase="grad_sync") for r in range(8))
    found = diagnose(
        None, None, Signals(hang=HangState(stalled=True, seconds_since_step=500.0, positions=positions))
    )
    assert found[0].ranks == (5,)


def test_live_glue() -> None:
    live = analyze_live(None, gpus=4, elapsed_hours=1.0, hang=HUNG, job_id="j")
    assert live.summary["slowdown"] is None and live.summary["diagnoses"][0]["cause"] == "hang"
    t = synthetic_table(SLOW)
    live = analyze_live(t, gpus=16, elapsed_hours=2.0, hosts={SLOW_RANK: "node-7"}, job_id="j", world_size=16)
    s = live.summary
    json.dumps(s, allow_nan=False)
    assert s["stragglers"][0]["rank"] == SLOW_RANK and s["stragglers"][0]["host"] == "node-7"
    assert s["gpu_hours_wasted"] == pytest.approx(s["waste_fraction"] * 16 * 2.0)
    assert live.rank_overall[SLOW_RANK] == max(live.rank_overall.values())
    assert len(live.steps) == 10 and live.workers["values"][5][1] == pytest.approx(
        s["stragglers"][0]["slowdown"]
    )
    ranks = live.rank_slowdown.ranks.tolist()
    assert ranks == sorted(ranks) and live.rank_slowdown.values.shape == (len(ranks), 10)


def test_cause_must_be_worth_a_few_percent_of_the_step() -> None:
    # A slow data loader that explains nearly all of a ~4% slowdown.
    t = synthetic_table(SyntheticJob(dp=8, steps=20, slow_data={(2, 0): 0.0015}))
    result = analyze(t)
    assert 1.03 < result.slowdown < 1.05
    assert causes(diagnose(t, result)) == ["data_loader"]
    # Asking for a 5% floor, the same finding is not worth naming.
    assert diagnose(t, result, config=DiagnosisConfig(min_excess=0.05)) == []
