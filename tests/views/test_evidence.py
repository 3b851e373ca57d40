"""Evidence as sentences (views/evidence.py), on the diagnoses the engine finds in jobs built to
have each cause: every cause reads as sentences that quote its own numbers, never as an object."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from smon_server.views.evidence import sentences
from smon_server.whatif.diagnosis import Diagnosis, diagnose
from smon_server.whatif.diagnosis.base import CAUSES
from smon_server.whatif.signals import GpuHealth, Signals
from tests.support.synthetic import SyntheticJob
from tests.whatif.step_records import DdpJob
from tests.whatif.test_diagnosis import HUNG, SEQ, SLOW, SLOW_RANK, run
from tests.whatif.test_live_truth import truth_and_summary


def throttled() -> Signals:
    def gpu(throttled: float, clock: float) -> GpuHealth:
        return GpuHealth(
            samples=60, throttled_fraction=throttled, sm_clock_ratio=clock, ecc_uncorrected=0, xid_events=0
        )

    health = {r: gpu(0.0, 1.0) for r in range(16)}
    health[SLOW_RANK] = gpu(0.7, 0.72)
    return Signals(gpu=health, hosts={SLOW_RANK: "node-7"})


JOBS: dict[str, Callable[[], list[Diagnosis]]] = {
    "data_loader": lambda: run(SyntheticJob(dp=8, steps=20, slow_data={(2, 0): 0.02})),
    "python_gc": lambda: run(SyntheticJob(dp=8, steps=40, gc_probability=0.1, gc_seconds=0.03, seed=1)),
    "checkpoint_io": lambda: run(
        SyntheticJob(dp=4, steps=30, checkpoint_every=5, checkpoint_seconds=0.2, jitter=0.01)
    ),
    "communication": lambda: run(SyntheticJob(dp=8, steps=10, grad_sync=0.01, slow_links={(3, 0): 5.0})),
    "slow_worker": lambda: run(SLOW, Signals(hosts={SLOW_RANK: "node-7"})),
    "gpu_throttling": lambda: run(SLOW, throttled()),
    "stage_imbalance": lambda: run(
        SyntheticJob(dp=4, pp=4, microbatches=8, steps=6, stage_factor=(1, 1, 1, 1.8), jitter=0.02)
    ),
    "sequence_imbalance": lambda: run(SEQ),
    "hang": lambda: diagnose(None, None, Signals(hang=HUNG)),
    "host_work": lambda: truth_and_summary(DdpJob(ranks=4, untimed=lambda r, s: 0.05 if r == 1 else 0.0))[2][
        "diagnoses"
    ],
}


def found(cause: str) -> dict[str, Any]:
    """The diagnosis of `cause` as the API serves it (through JSON, as stored)."""
    [d] = [d for d in JOBS[cause]() if d.cause == cause]
    served: dict[str, Any] = json.loads(json.dumps(d.to_json()))
    return served


@pytest.mark.parametrize("cause", sorted(JOBS))
def test_every_cause_reads_as_sentences(cause: str) -> None:
    d = found(cause)
    said = sentences(cause, d["evidence"])
    assert said, d["evidence"]
    keys = {k for k in d["evidence"] if "_" in k}
    for sentence in said:
        assert not sentence[0].islower() and sentence.endswith("."), sentence
        assert not re.search(r"[{}\[\]]|': ", sentence), sentence  # no object printed
        assert not [k for k in keys if k in sentence], sentence  # no field names


def test_the_sentences_quote_the_evidence() -> None:
    slow = found("slow_worker")["evidence"]
    [worker] = slow["workers"]
    text = " ".join(sentences("slow_worker", slow))
    assert f"Rank {worker['rank']} on node-7 (DP rank {worker['dp_rank']}, stage 1)" in text
    assert f"{worker['compute_ratio']:.2f}x as long as its stage peers" in text
    assert f"{min(slow['worker_share'], 1.0):.0%} of the slowdown" in text

    gpu = " ".join(sentences("gpu_throttling", found("gpu_throttling")["evidence"]))
    assert f"Rank {SLOW_RANK}'s GPU: throttled in 70% of samples, SM clock at 72% of its maximum." in gpu

    checkpoint = found("checkpoint_io")["evidence"]
    text = " ".join(sentences("checkpoint_io", checkpoint))
    assert (
        f"{checkpoint['checkpoints']} checkpoints, every {checkpoint['interval_steps']} steps, stop" in text
    )

    hang = " ".join(sentences("hang", found("hang")["evidence"]))
    assert "No step has completed for 300.0 s (the last was 812)." in hang
    assert "Suspect: rank 2." in hang


def test_evidence_no_wording_fits_is_listed_not_fatal() -> None:
    # A cause this version does not know, and a known one whose object has another shape (an
    # older server's): the scalar fields as 'key value' pairs, nothing raised.
    assert sentences("cosmic_rays", {"flips_per_hour": 3, "rack": "r7", "detail": {"x": 1}}) == [
        "flips per hour 3; rack r7"
    ]
    assert sentences("slow_worker", {"workers": [{"rank": 1}], "m_w": 0.5}) == ["m w 0.5"]
    assert sentences("data_loader", "not an object") == ["not an object"]  # type: ignore[arg-type]
    assert sentences("data_loader", {}) == []


def test_a_flagged_analysis_says_so() -> None:
    evidence = {**found("data_loader")["evidence"], "analysis_flag": "simulation discrepancy 1.080"}
    said = sentences("data_loader", evidence)
    assert said[-1] == "Less certain: simulation discrepancy 1.080."
    assert len(said) > 1


def test_every_cause_has_its_wording() -> None:
    assert set(JOBS) == set(CAUSES)
