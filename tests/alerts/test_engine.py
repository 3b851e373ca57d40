"""The alert lifecycle over stored analyses: pending → firing once → resolved after hysteresis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from smon_server.alerts.engine import Transition, evaluate
from smon_server.alerts.rules import DEFAULT_RULES, RulesError, load_rules
from smon_server.store.db import Database
from smon_server.store.models import Agent, Alert, AnalysisResult, GpuSample, Silence
from tests.support.factories import stored_job

T0 = 1_800_000_000.0
STALL = 1e6  # the jobs stay "running" however far the test moves the clock


def job(db: Database, job_id: str = "j", *, step_ago: float = 1.0, **result: Any) -> None:
    with db.transaction() as s:
        stored_job(s, job_id, T0, step_ago=step_ago, agents=[(0, 100, 1, False, 0), (1, 100, 1, False, 0)])
        if result:
            s.add(AnalysisResult(job_id=job_id, computed_at=T0, state="running", steps_seen=100, **result))


def set_result(db: Database, job_id: str = "j", **values: Any) -> None:
    with db.transaction() as s:
        row = s.get(AnalysisResult, (job_id, 1))
        assert row is not None
        for k, v in values.items():
            setattr(row, k, v)


def run(db: Database, at: float, stall: float = STALL) -> list[Transition]:
    with db.transaction() as s:
        out = evaluate(s, now=T0 + at, rules=DEFAULT_RULES, stall_seconds=stall, horizon=1e7)
    assert out is not None
    return out


def alerts(db: Database) -> list[Alert]:
    with db.session() as s:
        return list(s.scalars(select(Alert).order_by(Alert.id)))


def test_straggling_job_pages_once_and_resolves_after_hysteresis(db: Database) -> None:
    rule = next(r for r in DEFAULT_RULES if r.name == "job_straggling")
    hold, keep = rule.for_seconds, rule.keep_firing_for
    job(db, slowdown=1.2, recent_slowdown=1.2, recent_stragglers=[], stragglers=0)
    assert run(db, 0) == []
    assert [a.state for a in alerts(db)] == ["pending"]
    assert run(db, hold - 1) == []
    fired = run(db, hold + 1)  # held for `for`
    assert [t.kind for t in fired] == ["firing"]
    first = alerts(db)[0]
    assert (first.state, first.severity, first.rule, first.dedup_key) == (
        "firing",
        "warning",
        "job_straggling",
        "smon/j/job_straggling",
    )
    assert "1.20x slower" in first.summary
    assert run(db, hold + 10) == []  # fires once
    set_result(db, recent_slowdown=1.05)
    assert run(db, hold + 20) == [] and run(db, hold + keep) == []  # a dip shorter than keep_firing_for
    set_result(db, recent_slowdown=1.25)
    last_true = hold + keep + 5
    assert run(db, last_true) == []
    assert [a.id for a in alerts(db)] == [first.id]  # the same incident throughout
    set_result(db, recent_slowdown=1.0)
    assert run(db, last_true + keep - 1) == []
    resolved = run(db, last_true + keep + 1)  # keep_firing_for after the condition last held
    assert resolved == [Transition(first.id, "resolved")]
    assert alerts(db)[0].state == "resolved"
    set_result(db, recent_slowdown=1.3)
    run(db, last_true + keep + 10)
    assert [(a.state, a.severity) for a in alerts(db)] == [("resolved", "warning"), ("pending", "critical")]


def test_a_blip_shorter_than_for_pages_nobody(db: Database) -> None:
    job(db, slowdown=1.2, recent_slowdown=1.2)
    run(db, 0)
    set_result(db, recent_slowdown=1.0)
    assert run(db, 10) == []
    (alert,) = alerts(db)
    assert alert.state == "resolved" and alert.fired_at is None


def test_flagged_analyses_never_page(db: Database) -> None:
    job(db, slowdown=1.8, recent_slowdown=1.8, flagged=True)
    for at in (0, 100, 500):
        assert run(db, at) == []
    assert alerts(db) == []


def test_stalled_job_fires_at_once_and_each_host_gets_one_incident(db: Database) -> None:
    job(db, "hung", step_ago=600)
    where = {"positions": {"step 9 / grad_sync": "0-2", "step 8 / forward": "3"}, "suspect_ranks": "3"}
    with db.transaction() as s:
        s.add(
            AnalysisResult(
                job_id="hung",
                computed_at=T0,
                state="stalled",
                steps_seen=10,
                summary={
                    "diagnoses": [{"cause": "hang", "evidence": where, "recommendation": "dump stacks"}]
                },
            )
        )
    job(
        db,
        "slow",
        slowdown=1.4,
        recent_slowdown=1.4,
        recent_stragglers=[
            {"rank": 3, "host": "node-1", "cause": "slow_worker"},
            {"rank": 2, "host": "node-1", "cause": "slow_worker"},
            {"rank": 9, "host": "node-4", "cause": "gpu_throttling"},
        ],
    )
    fired = run(db, 0, stall=120)
    by_key = {a.dedup_key: a for a in alerts(db)}
    assert {t.alert_id for t in fired} == {
        by_key["smon/hung/job_stalled"].id,
        by_key["smon/slow/gpu_unhealthy/node-4"].id,  # for 0: at once
    }
    stalled = by_key["smon/hung/job_stalled"]
    assert stalled.state == "firing" and stalled.details == {**where, "attempt": 1}  # where each rank stands
    assert "suspect rank(s) 3" in stalled.summary
    assert by_key["smon/slow/job_straggling"].severity == "critical"
    details = by_key["smon/slow/job_straggling"].details or {}
    assert (details["worst_rank"], details["cause"]) == (3, "slow_worker")
    assert by_key["smon/slow/worker_straggling/node-1"].details == {"ranks": [3, 2], "attempt": 1}
    assert "smon/slow/worker_straggling/node-4" in by_key
    assert len(by_key) == 5  # one per (job, rule[, host]), not one per rank


def test_silences_match_labels_and_expire(db: Database) -> None:
    job(db, slowdown=1.2, recent_slowdown=1.2)
    with db.transaction() as s:
        s.add(Silence(matchers={"job": "j*", "rule": "job_straggling"}, starts_at=T0, ends_at=T0 + 100))
    run(db, 0)
    assert alerts(db)[0].silenced
    run(db, 120)
    assert not alerts(db)[0].silenced


def test_lifecycle_survives_a_restart(db: Database) -> None:
    """The state is in the database: another process (a new Database) continues the incident."""
    job(db, slowdown=1.2, recent_slowdown=1.2)
    run(db, 0)
    assert [t.kind for t in run(db, 300)] == ["firing"]
    again = Database(db.url)
    try:
        assert run(again, 310) == []  # not fired a second time
        assert [a.state for a in alerts(again)] == ["firing"]
    finally:
        again.dispose()


def test_rules_file_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(
        "rules:\n"
        "  - name: job_straggling\n    for: 300\n    threshold: 1.2\n"
        "  - name: job_stalled\n    enabled: false\n"
    )
    rules = {r.name: r for r in load_rules(str(path))}
    assert (rules["job_straggling"].for_seconds, rules["job_straggling"].threshold) == (300, 1.2)
    assert rules["job_straggling"].critical_threshold == 1.3  # untouched
    assert not rules["job_stalled"].enabled
    path.write_text("rules:\n  - name: nope\n")
    with pytest.raises(RulesError, match="unknown rule"):
        load_rules(str(path))
    path.write_text("rules:\n  - name: job_stalled\n    fore: 3\n")
    with pytest.raises(RulesError, match="unknown keys"):
        load_rules(str(path))


def test_ranks_that_stop_reporting_while_others_go_on(db: Database) -> None:
    with db.transaction() as s:
        # ranks 0 and 1 report; rank 2 went silent 300 s ago; rank 3 said goodbye long ago
        stored_job(
            s,
            "half",
            T0,
            agents=[
                (0, 900, 1, False, 0),
                (1, 900, 1, False, 0),
                (2, 900, 300, False, 0),
                (3, 900, 600, True, 0),
            ],
        )
    with db.transaction() as s:
        out = evaluate(s, now=T0, rules=DEFAULT_RULES, stall_seconds=120, horizon=1e7)
    assert out is not None and [t.kind for t in out] == ["firing"]
    (alert,) = alerts(db)
    assert alert.rule == "ranks_not_reporting" and alert.details == {
        "ranks": [2],
        "hosts": [""],
        "attempt": 1,
    }
    assert "rank 2" in alert.summary


def test_a_throttling_gpu_pages_per_host(db: Database) -> None:
    job(
        db,
        slowdown=1.05,
        recent_slowdown=1.05,  # below the straggling line: the GPU rule stands on its own
        recent_stragglers=[{"rank": 5, "host": "node-2", "cause": "gpu_throttling"}],
    )
    fired = run(db, 0)
    assert len(fired) == 1
    by_rule = {a.rule: a for a in alerts(db)}
    assert by_rule["gpu_unhealthy"].host == "node-2" and by_rule["gpu_unhealthy"].severity == "critical"
    assert "job_straggling" not in by_rule


def test_dropping_records_fires_while_the_counter_grows(db: Database) -> None:
    with db.transaction() as s:
        stored_job(s, "lossy", T0, agents=[(0, 100, 1, False, 0), (1, 100, 1, False, 0)])
    assert run(db, 0) == []  # nothing dropped
    with db.transaction() as s:
        agent = s.scalars(select(Agent).where(Agent.job_id == "lossy", Agent.rank == 1)).one()
        agent.dropped_records = 40
    assert [t.kind for t in run(db, 10)] == ["firing"]
    (alert,) = [a for a in alerts(db) if a.rule == "agents_dropping_records"]
    assert alert.details == {"dropped_records": 40, "new_since_last_check": 40}
    assert run(db, 300) == []  # still within the 10-minute window
    resolved = run(db, 10 + 600 + 300 + 1)  # no growth for the window, then keep_firing_for
    assert [t.kind for t in resolved] == ["resolved"]


def test_gpu_faults_page_per_host(db: Database) -> None:
    job(db, slowdown=1.0, recent_slowdown=1.0)
    with db.transaction() as s:
        for i, agent in enumerate(s.scalars(select(Agent).where(Agent.job_id == "j")).all()):
            agent.host = f"node-{i}"
        for t, (xids, ecc) in enumerate([([], 0), ([79], 0), ([], 0)]):  # rank 0: an XID 79
            s.add(
                GpuSample(
                    job_id="j", rank=0, gpu_index=0, time=T0 - 100 + t, xid_events=xids, ecc_uncorrected=ecc
                )
            )
        for t, ecc in enumerate([2, 2, 5]):  # rank 1: 3 new uncorrectable ECC errors
            s.add(
                GpuSample(
                    job_id="j", rank=1, gpu_index=0, time=T0 - 100 + t, xid_events=[], ecc_uncorrected=ecc
                )
            )
        s.add(
            GpuSample(job_id="j", rank=1, gpu_index=0, time=T0 - 5000, xid_events=[13], ecc_uncorrected=0)
        )  # too old
    fired = run(db, 0)
    by_key = {a.dedup_key: a for a in alerts(db) if a.rule == "gpu_fault"}
    assert len(fired) == 2 and set(by_key) == {"smon/j/gpu_fault/node-0", "smon/j/gpu_fault/node-1"}
    assert "XID 79" in by_key["smon/j/gpu_fault/node-0"].summary
    assert (by_key["smon/j/gpu_fault/node-1"].details or {})["gpus"] == [
        {"rank": 1, "xid": [], "ecc_uncorrected": 3}
    ]
    assert all(a.severity == "critical" for a in by_key.values())
