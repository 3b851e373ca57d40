"""Slack, PagerDuty and webhook notifications, delivered to real HTTP receivers on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from smon_server.alerts import outbox, sender
from smon_server.alerts.notifiers import Message
from smon_server.alerts.notifiers.pagerduty import PagerDuty
from smon_server.alerts.notifiers.slack import Slack
from smon_server.alerts.notifiers.webhook import ZERO_TIME, Webhook
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.store.db import Database
from smon_server.store.models import Alert, Notification
from tests.alerts.receivers import Receiver, receiver
from tests.api.test_jobs import SLOW_RANK, push_job
from tests.support import factories as f
from tests.support.settings import server_settings

MESSAGE = Message(
    event="firing",
    alert_id=7,
    dedup_key="smon/gpt/job_straggling",
    rule="job_straggling",
    job_id="gpt",
    host="",
    severity="critical",
    summary="Job gpt runs 1.42x slower than it would without stragglers",
    started_at=1_800_000_000.0,
    resolved_at=None,
    link="https://smon.example/jobs/gpt",
    slowdown=1.42,
    waste_fraction=0.296,
    worst_ranks=["rank 3 on node-1 (slow_worker)"],
    cause="slow_worker",
    recommendation="Drain node-1 and check its GPU",
    details={"slowdown": 1.42},
)


def test_pagerduty_events_v2() -> None:
    pd = PagerDuty("rk-123", "http://pd")
    body = pd.payload(MESSAGE)
    assert body is not None
    assert (body["routing_key"], body["event_action"], body["dedup_key"]) == (
        "rk-123",
        "trigger",
        MESSAGE.dedup_key,
    )
    p = body["payload"]
    assert set(p) == {"summary", "source", "severity", "component", "group", "class", "custom_details"}
    assert (p["severity"], p["component"], p["group"], p["class"]) == (
        "critical",
        "gpt",
        "job_straggling",
        "slow_worker",
    )
    assert p["custom_details"]["worst_ranks"] == ["rank 3 on node-1 (slow_worker)"]
    assert p["custom_details"]["recommendation"] == "Drain node-1 and check its GPU"
    assert body["links"] == [{"href": MESSAGE.link, "text": "Job gpt in SMon"}]
    for event, action in (("acknowledged", "acknowledge"), ("resolved", "resolve")):
        other = pd.payload(replace(MESSAGE, event=event))
        assert other == {"routing_key": "rk-123", "event_action": action, "dedup_key": MESSAGE.dedup_key}


def test_slack_text_and_blocks() -> None:
    body = Slack("http://slack").payload(MESSAGE)
    assert body is not None and "1.42x slower" in body["text"] and "CRITICAL" in body["text"]
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds == ["header", "section", "section", "actions"]
    fields = " ".join(x["text"] for x in body["blocks"][1]["fields"])
    assert "1.42x" in fields and "30%" in fields and "rank 3 on node-1" in fields
    assert "Drain node-1" in body["blocks"][2]["text"]["text"]
    assert body["blocks"][3]["elements"][0]["url"] == MESSAGE.link
    assert Slack("x").payload(replace(MESSAGE, event="acknowledged")) is None


def test_webhook_has_alertmanagers_shape() -> None:
    body = Webhook("http://hook", "https://smon.example").payload(MESSAGE)
    assert body is not None
    assert set(body) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert (body["version"], body["status"], body["externalURL"]) == ("4", "firing", "https://smon.example")
    (alert,) = body["alerts"]
    assert set(alert) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert alert["labels"] == {"alertname": "job_straggling", "job": "gpt", "severity": "critical"}
    assert alert["startsAt"] == "2027-01-15T08:00:00Z" and alert["endsAt"] == ZERO_TIME
    resolved = Webhook("h", "p").payload(replace(MESSAGE, event="resolved", resolved_at=1_800_000_060.0))
    assert resolved is not None and resolved["status"] == "resolved"
    assert resolved["alerts"][0]["endsAt"] == "2027-01-15T08:01:00Z"


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


def queued(db: Database, hook: Receiver) -> int:
    """One firing alert with a webhook notification queued for it; returns the alert id."""
    with db.transaction() as s:
        alert = Alert(
            dedup_key="smon/j/job_straggling",
            rule="job_straggling",
            job_id="j",
            host="",
            severity="warning",
            state="firing",
            summary="slow",
            started_at=100.0,
            fired_at=100.0,
            last_true_at=100.0,
            acked_by="",
            silenced=False,
        )
        s.add(alert)
        s.flush()
        assert (
            outbox.enqueue(s, alert, "firing", [Webhook(hook.url + "/hook", "p")], public_url="p", now=100.0)
            == 1
        )
        return alert.id


def rows(db: Database) -> list[Notification]:
    with db.session() as s:
        return list(s.query(Notification).order_by(Notification.id))


def test_retried_with_backoff_after_a_receiver_error(db: Database, hook: Receiver) -> None:
    queued(db, hook)
    hook.statuses[:] = [500]
    by_name = {"webhook": Webhook(hook.url + "/hook", "p")}
    with httpx.Client() as client:
        assert sender.send_due(db, by_name, client, now=100.0) == 0
        (row,) = rows(db)
        assert (row.attempts, row.sent_at) == (1, None) and "HTTP 500" in row.last_error
        assert sender.send_due(db, by_name, client, now=101.0) == 0  # not due yet: backoff
        assert sender.send_due(db, by_name, client, now=time.time() + 3) == 1
    (row,) = rows(db)
    assert row.attempts == 2 and row.sent_at is not None and row.last_error == ""
    assert len(hook.bodies("/hook")) == 1


def test_a_stalled_receiver_times_out_and_is_retried(
    db: Database, hook: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued(db, hook)
    monkeypatch.setattr(sender, "TIMEOUT", httpx.Timeout(0.3))
    hook.release.clear()
    by_name = {"webhook": Webhook(hook.url + "/hook", "p")}
    with httpx.Client() as client:
        assert sender.send_due(db, by_name, client, now=100.0) == 0
        assert "Timeout" in rows(db)[0].last_error
        hook.release.set()
        assert sender.send_due(db, by_name, client, now=time.time() + 3) == 1


def paging_settings(database_url: str, tmp_path: Path, url: str) -> object:
    rules = tmp_path / "rules.yml"
    rules.write_text("rules:\n  - name: job_straggling\n    for: 0\n    keep_firing_for: 0\n")
    return server_settings(
        database_url,
        alert_rules=str(rules),
        analysis_interval=3600,
        slack_webhook_url=url + "/slack",
        pagerduty_routing_key="rk",
        pagerduty_url=url + "/pd",
        webhook_url=url + "/hook",
        public_url="https://smon.example",
    )


def test_a_page_flows_to_every_receiver_and_is_acked_and_resolved_once(
    database_url: str, tmp_path: Path, hook: Receiver
) -> None:
    job = f.new_job_id("slow")
    with BackgroundServer(paging_settings(database_url, tmp_path, hook.url)) as server:  # type: ignore[arg-type]
        assert server.context is not None
        push_job(server, job, slow_rank=SLOW_RANK, slow_forward=0.03)
        analysis_pass(server.context, time.time())
        (trigger,) = hook.wait_for("/pd", 1)
        assert trigger["event_action"] == "trigger" and trigger["dedup_key"] == f"smon/{job}/job_straggling"
        assert trigger["links"][0]["href"] == f"https://smon.example/jobs/{job}"
        assert f"node-{SLOW_RANK}" in " ".join(trigger["payload"]["custom_details"].get("worst_ranks", []))
        (slack,) = hook.wait_for("/slack", 1)
        assert "slower than it would without stragglers" in slack["text"]
        (page,) = hook.wait_for("/hook", 1)
        assert page["status"] == "firing" and page["alerts"][0]["labels"]["job"] == job

        with httpx.Client(base_url=server.http_url) as c:
            alert = c.get("/api/v1/alerts", params={"job": job, "state": "firing"}).json()["alerts"][0]
            c.post(f"/api/v1/alerts/{alert['id']}/ack", json={"by": "me"})
            assert [b["event_action"] for b in hook.wait_for("/pd", 2)] == ["trigger", "acknowledge"]
            deadline = time.monotonic() + 10
            while True:  # the sender marks rows sent just after the receiver answers
                record = c.get(f"/api/v1/alerts/{alert['id']}").json()["notifications"]
                if all(n["sent_at"] for n in record) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        assert sorted((n["notifier"], n["event"]) for n in record) == [
            ("pagerduty", "acknowledged"),
            ("pagerduty", "firing"),
            ("slack", "firing"),
            ("webhook", "firing"),
        ]
        assert all(n["sent_at"] and n["attempts"] == 1 and n["last_error"] == "" for n in record)

        analysis_pass(server.context, time.time())  # still straggling: no second page
        analysis_pass(server.context, time.time() + 100_000)  # the job has long gone: resolved
        actions = [b["event_action"] for b in hook.wait_for("/pd", 3)]
        assert actions == ["trigger", "acknowledge", "resolve"]
        assert [b["status"] for b in hook.wait_for("/hook", 2)] == ["firing", "resolved"]
        assert len(hook.wait_for("/slack", 2)) == 2


def test_a_slow_receiver_never_slows_analysis_and_a_restart_sends_nothing_twice(
    database_url: str, tmp_path: Path, hook: Receiver
) -> None:
    job = f.new_job_id("slow")
    settings = paging_settings(database_url, tmp_path, hook.url)
    hook.release.clear()  # every POST stalls until released
    with BackgroundServer(settings) as server:  # type: ignore[arg-type]
        assert server.context is not None
        push_job(server, job, slow_rank=SLOW_RANK, slow_forward=0.03)
        analysis_pass(server.context, time.time())
        deadline = time.monotonic() + 30
        while hook.stalled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hook.stalled >= 1  # the sender is stuck in a POST ...
        other = f.new_job_id("more")
        push_job(server, other)  # ... and ingest and analysis go on regardless
        analysis_pass(server.context, time.time())
        with httpx.Client(base_url=server.http_url) as c:
            assert c.get(f"/api/v1/jobs/{other}/summary").status_code == 200
        assert hook.requests == []
        hook.release.set()
        hook.wait_for("/pd", 1)
    with BackgroundServer(settings) as server:  # type: ignore[arg-type]
        assert server.context is not None
        analysis_pass(server.context, time.time())
        time.sleep(3)  # a few sender rounds
    pd = [b["event_action"] for b in hook.bodies("/pd")]
    assert pd.count("trigger") == 1  # not paged again after the restart
    assert len(hook.bodies("/slack")) <= 1 and len(hook.bodies("/hook")) <= 1  # no receiver got it twice
