"""Alert events into the notification outbox, in the transaction that made them.

A notifier is never called here: rows are written next to the alert's own change, so an event is
sent exactly when its transition committed, and a crash between the two loses nothing. The
sender (sender.py) delivers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.alerts.notifiers import Message, Notifier
from smon_server.store import queries
from smon_server.store.models import Alert, Notification


def message(session: Session, alert: Alert, event: str, public_url: str) -> Message:
    """The event with the latest analysis of the job attempt it holds in around it: S, waste,
    worst ranks, cause, advice. Once the job has more than one attempt, the link names it."""
    details = dict(alert.details or {})
    if not alert.job_id and alert.host:
        return _host_message(alert, event, details, public_url)
    attempt = int(details.get("attempt") or 1)
    parts = (
        queries.result_parts(session=session, job_id=alert.job_id, attempt=attempt, parts=["summary"]) or {}
    )
    summary: dict[str, Any] = parts.get("summary") or {}
    recent = (summary.get("recent") or {}).get("stragglers") or []
    stragglers = recent or summary.get("stragglers") or []
    diagnoses = summary.get("diagnoses") or []
    lead = diagnoses[0] if diagnoses else {}
    link = f"{public_url.rstrip('/')}/jobs/{quote(alert.job_id, safe='')}"
    if attempt > 1 or queries.attempt_count(session=session, job_id=alert.job_id) > 1:
        link += f"?attempt={attempt}"
    return Message(
        event=event,
        alert_id=alert.id,
        dedup_key=alert.dedup_key,
        rule=alert.rule,
        job_id=alert.job_id,
        host=alert.host,
        severity=alert.severity,
        summary=alert.summary,
        started_at=alert.fired_at or alert.started_at,
        resolved_at=alert.resolved_at,
        link=link,
        slowdown=details.get("slowdown", summary.get("slowdown")),
        waste_fraction=summary.get("waste_fraction"),
        worst_ranks=[
            f"rank {s['rank']} on {s.get('host') or '?'} ({s.get('cause') or 'unknown cause'})"
            for s in stragglers[:5]
        ],
        cause=details.get("cause") or lead.get("cause"),
        recommendation=lead.get("recommendation"),
        details=details,
    )


def _host_message(alert: Alert, event: str, details: dict[str, Any], public_url: str) -> Message:
    """A per-host alert (host_suspect): the host's page, the jobs it slowed, its GPUs."""
    jobs = details.get("jobs") or []
    return Message(
        event=event,
        alert_id=alert.id,
        dedup_key=alert.dedup_key,
        rule=alert.rule,
        job_id=alert.job_id,
        host=alert.host,
        severity=alert.severity,
        summary=alert.summary,
        started_at=alert.fired_at or alert.started_at,
        resolved_at=alert.resolved_at,
        link=f"{public_url.rstrip('/')}/hosts/{quote(alert.host, safe='')}",
        worst_ranks=[
            f"rank {j['rank']} of job {j['job_id']} ({j.get('cause') or 'unknown cause'}, "
            f"S_w {float(j.get('slowdown') or 0):.2f})"
            for j in jobs[:5]
        ],
        cause=details.get("cause"),
        recommendation=details.get("recommendation"),
        details=details,
    )


def enqueue(
    session: Session, alert: Alert, event: str, notifiers: Sequence[Notifier], *, public_url: str, now: float
) -> int:
    """Queue `event` of `alert` for every notifier with something to say; returns how many rows.
    A silenced incident pages nobody; its resolution is still sent where its firing was, so no
    incident stays open in PagerDuty."""
    if not notifiers:
        return 0
    if alert.silenced and event != "resolved":
        return 0
    if event != "firing":
        fired = session.scalars(
            select(Notification.notifier).where(
                Notification.alert_id == alert.id, Notification.event == "firing"
            )
        ).all()
        notifiers = [n for n in notifiers if n.name in set(fired)]
    m = message(session, alert, event, public_url)
    count = 0
    for n in notifiers:
        body = n.payload(m)
        if body is None:
            continue
        session.add(
            Notification(
                alert_id=alert.id,
                notifier=n.name,
                event=event,
                payload=body,
                created_at=now,
                attempts=0,
                next_attempt_at=0.0,  # due at once
                last_error="",
            )
        )
        count += 1
    return count
