"""The host_suspect rule through the alert lifecycle, and what Slack, PagerDuty and webhooks get."""

from __future__ import annotations

import time

from sqlalchemy import select

from smon_server.alerts import outbox
from smon_server.alerts.engine import Transition, evaluate
from smon_server.alerts.notifiers import Notifier
from smon_server.alerts.notifiers.pagerduty import PagerDuty
from smon_server.alerts.notifiers.slack import Slack
from smon_server.alerts.notifiers.webhook import Webhook
from smon_server.alerts.rules import DEFAULT_RULES
from smon_server.hosts.fleet import Policy
from smon_server.store.db import Database
from smon_server.store.models import Alert, Notification, Silence
from tests.hosts.builders import analysed_job, refresh

DAY = 86_400.0
NOTIFIERS: list[Notifier] = [
    Slack("http://slack"),
    PagerDuty("rk", "http://pd"),
    Webhook("http://hook", "https://smon.example"),
]


def run(db: Database, now: float) -> list[Transition]:
    refresh(db, now)
    with db.transaction() as s:
        out = evaluate(s, now=now, rules=DEFAULT_RULES, stall_seconds=1e9, horizon=0.0, host_policy=Policy())
        assert out is not None
        for t in out:
            alert = s.get(Alert, t.alert_id)
            assert alert is not None
            outbox.enqueue(s, alert, t.kind, NOTIFIERS, public_url="https://smon.example", now=now)
    return out


def host_alerts(db: Database) -> list[Alert]:
    with db.session() as s:
        return list(s.scalars(select(Alert).where(Alert.rule == "host_suspect").order_by(Alert.id)))


def payloads(db: Database, event: str) -> dict[str, dict]:
    with db.session() as s:
        rows = s.scalars(select(Notification).where(Notification.event == event)).all()
        return {n.notifier: n.payload for n in rows}


def straggles(db: Database, job: str, at: float, host: str = "node-a") -> None:
    analysed_job(db, job, hosts=[host, "node-ok"], stragglers=[(0, "slow_worker", 1.3)], slowdown=1.3, at=at)


def test_a_suspect_host_pages_once_with_its_gpus_and_jobs_and_resolves_when_clean(db: Database) -> None:
    now = time.time()
    straggles(db, "j1", now - 300)
    straggles(db, "j2", now - 200)
    straggles(db, "b1", now - 200, host="node-b")  # once: never suspect
    assert run(db, now) == []  # two jobs: not yet
    straggles(db, "j3", now - 100)
    fired = run(db, now)
    assert [t.kind for t in fired] == ["firing"]
    (alert,) = host_alerts(db)
    assert alert.details is not None
    assert (alert.host, alert.job_id, alert.state, alert.dedup_key) == (
        "node-a",
        "",
        "firing",
        "smon//host_suspect/node-a",
    )
    assert sorted(j["job_id"] for j in alert.details["jobs"]) == ["j1", "j2", "j3"]
    assert alert.details["gpus"] == ["GPU-node-a-0"]
    # More jobs, more passes: the same incident, no new page.
    straggles(db, "j4", now - 50)
    assert run(db, now + 10) == [] and run(db, now + 20) == []
    assert len(host_alerts(db)) == 1 and len(payloads(db, "firing")) == 3

    sent = payloads(db, "firing")
    pd = sent["pagerduty"]
    assert pd["payload"]["source"] == "node-a" and pd["payload"]["component"] == "node-a"
    assert pd["payload"]["custom_details"]["host"] == "node-a"
    assert pd["payload"]["custom_details"]["gpus"] == ["GPU-node-a-0"]
    assert {j["job_id"] for j in pd["payload"]["custom_details"]["jobs"]} == {"j1", "j2", "j3"}
    assert pd["links"][0]["href"] == "https://smon.example/hosts/node-a"
    assert "burn-in" in pd["payload"]["custom_details"]["recommendation"]
    hook = sent["webhook"]["alerts"][0]
    assert hook["labels"]["host"] == "node-a" and hook["annotations"]["gpus"] == "GPU-node-a-0"
    assert hook["annotations"]["jobs"] == "j1, j2, j3"
    slack = str(sent["slack"]["blocks"])
    assert "node-a" in slack and "GPU-node-a-0" in slack and "job j3" in slack

    # Clean (no new straggler incident) for the rule's period: resolved, though the incidents
    # still make it suspect for the rest of the week.
    resolved = run(db, now + DAY + 60)
    assert [t.kind for t in resolved] == ["resolved"]
    assert host_alerts(db)[0].state == "resolved"
    assert set(payloads(db, "resolved")) == {"pagerduty", "webhook", "slack"}


def test_a_silenced_host_pages_nobody(db: Database) -> None:
    now = time.time()
    with db.transaction() as s:
        s.add(Silence(matchers={"host": "node-a*"}, starts_at=now - 10, ends_at=now + 3600, created_by="t"))
    for i in range(3):
        straggles(db, f"j{i}", now - 100 + i)
    assert [t.kind for t in run(db, now)] == ["firing"]
    assert host_alerts(db)[0].silenced
    assert payloads(db, "firing") == {}
