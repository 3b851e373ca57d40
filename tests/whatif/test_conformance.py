"""The paper's published results on its three real traces (DESIGN §5 conformance).

Expected numbers are read from the artifact's JSON files at test time; nothing is pasted here.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pytest

from tests.whatif.conftest import Conformance

EXPECTED_FIRST = {"AR": "slow_worker", "ST": "stage_imbalance", "SE": "sequence_imbalance"}


def _key(kind: str, name: str) -> object:
    return name if kind == "optype" else int(name)


def test_slowdown_within_1_percent(conformance: Conformance) -> None:
    expected = conformance.expected["blocking_slowdown"]
    assert conformance.result.slowdown == pytest.approx(expected, rel=0.01)


def test_step_times_match_the_replay_of_the_artifact(conformance: Conformance) -> None:
    r, e = conformance.result, conformance.expected
    steps = [int(s) for s in e["step_t_nodelay"]]
    assert sorted(steps) == r.steps.tolist()
    by_step = dict(zip(r.steps.tolist(), r.step_time.tolist(), strict=True))
    for s in steps:
        assert by_step[s] == pytest.approx(e["step_t_nodelay"][str(s)], rel=1e-3)
        assert r.ideal_step_time == pytest.approx(e["step_t_noblk"][str(s)], rel=1e-3)
    assert r.slowdown == pytest.approx(
        np.mean(list(e["step_t_nodelay"].values())) / np.mean(list(e["step_t_noblk"].values())), rel=1e-3
    )


def test_discrepancy_close(conformance: Conformance) -> None:
    assert conformance.result.discrepancy == pytest.approx(conformance.expected["launch_slowdown"], rel=0.002)
    assert not conformance.result.discrepancy_flagged


@pytest.mark.parametrize("kind", ["optype", "dp_rank", "stage"])
def test_every_attribution_within_2_percent(conformance: Conformance, kind: str) -> None:
    r, e = conformance.result, conformance.expected
    views: dict[str, dict[Any, float]] = {
        "optype": r.by_op_type,
        "dp_rank": r.by_dp_rank,
        "stage": r.by_stage,
    }
    ours = views[kind]
    expected = e[f"blocking_decompose_by_{kind}"]
    assert {_key(kind, k) for k in expected} == set(ours)
    for name, value in expected.items():
        assert ours[_key(kind, name)] == pytest.approx(value, rel=0.02), (kind, name)

    view: Literal["op_type", "dp_rank", "stage"] = "op_type" if kind == "optype" else kind  # type: ignore[assignment]
    per_step = r.per_step(view)
    for step, values in e[f"blocking_decompose_by_{kind}_per_step"].items():
        for name, value in values.items():
            assert per_step[int(step)][_key(kind, name)] == pytest.approx(value, rel=0.02), (step, name)
    for step, value in e["blocking_step_slowdown"].items():
        i = r.steps.tolist().index(int(step))
        assert r.step_slowdown[i] == pytest.approx(value, rel=0.02)


def test_same_worst_stage_and_dp_rank(conformance: Conformance) -> None:
    r, e = conformance.result, conformance.expected
    for kind, ours in (("stage", r.by_stage), ("dp_rank", r.by_dp_rank)):
        expected = e[f"blocking_decompose_by_{kind}"]
        assert max(ours, key=lambda k: ours[k]) == int(max(expected, key=lambda k: expected[k]))


def test_removal_metrics_within_003(conformance: Conformance) -> None:
    a = conformance.result.attribution
    assert a is not None
    assert a.m_w == pytest.approx(conformance.mw["rem"], abs=0.03)
    assert a.m_s == pytest.approx(conformance.ms["rem"], abs=0.03)
    assert a.m_w_add == pytest.approx(conformance.mw["add"], abs=0.03)
    assert a.m_s_add == pytest.approx(conformance.ms["add"], abs=0.03)


def test_first_diagnosis(conformance: Conformance) -> None:
    causes = [d.cause for d in conformance.diagnoses]
    assert causes, "no diagnosis"
    assert causes[0] == EXPECTED_FIRST[conformance.name]
    if conformance.name == "SE":
        assert "stage_imbalance" in causes
    shares = [d.share for d in conformance.diagnoses]
    assert shares == sorted(shares, reverse=True)


def test_no_data_repairs_needed(conformance: Conformance) -> None:
    q = conformance.result.quality
    assert (q.dropped_steps, q.duplicate_ops, q.absent_ops, q.reordered_instances) == (0, 0, 0, 0)
    assert q.rows_used == len(conformance.table)
