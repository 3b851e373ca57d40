"""Delivers the outbox: due rows are claimed (so replicas never send one twice), posted with a
short timeout, and marked sent or rescheduled with backoff. Runs on its own thread: a slow or dead
receiver delays only other notifications, never ingest or analysis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import httpx
from sqlalchemy import select

from smon_server.alerts.notifiers import Notifier
from smon_server.store.db import DATABASE_UNAVAILABLE, Database
from smon_server.store.models import Notification

log = logging.getLogger(__name__)

BACKOFF = (2.0, 5.0, 15.0, 60.0, 300.0)  # seconds after attempt 1, 2, ...; then every 300 s
MAX_ATTEMPTS = 50  # about four hours of retries, then the row stays as a record of the failure
CLAIM_SECONDS = 60.0  # a claimed row is not due for others while it is being sent
TIMEOUT = httpx.Timeout(5.0)


def backoff(attempts: int) -> float:
    return BACKOFF[min(attempts, len(BACKOFF)) - 1]


def send_due(
    db: Database, notifiers: Mapping[str, Notifier], client: httpx.Client, now: float, limit: int = 50
) -> int:
    """Send what is due; returns how many were delivered."""
    with db.transaction() as session:
        rows = session.scalars(
            select(Notification)
            .where(
                Notification.sent_at.is_(None),
                Notification.next_attempt_at <= now,
                Notification.attempts < MAX_ATTEMPTS,
            )
            .order_by(Notification.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
        claimed = [(r.id, r.notifier, r.payload, r.attempts) for r in rows]
        for r in rows:
            r.next_attempt_at = now + CLAIM_SECONDS
    delivered = 0
    for row_id, name, payload, attempts in claimed:
        notifier = notifiers.get(name)
        error = ""
        if notifier is None:
            error = f"notifier {name} is not configured on this server"
        else:
            try:
                response = client.post(notifier.url, json=payload, timeout=TIMEOUT)
                if response.status_code >= 300:
                    error = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"[:500]
        with db.transaction() as session:
            row = session.get(Notification, row_id)
            if row is None:
                continue
            row.attempts = attempts + 1
            if error:
                row.last_error = error[:1024]
                row.next_attempt_at = time.time() + backoff(row.attempts)
                log.warning(
                    "notification %d to %s failed (attempt %d): %s", row_id, name, row.attempts, error
                )
            else:
                row.sent_at, row.last_error = time.time(), ""
                delivered += 1
    return delivered


async def sender_loop(
    db: Database, notifiers: list[Notifier], stop: asyncio.Event, every: float = 1.0
) -> None:
    by_name = {n.name: n for n in notifiers}
    if not by_name:
        return
    with httpx.Client() as client:
        while not stop.is_set():
            try:
                await asyncio.to_thread(send_due, db, by_name, client, time.time())
            except DATABASE_UNAVAILABLE as exc:  # logged once per outage (store/availability.py)
                db.availability.failed(exc)
            except Exception:
                log.exception("sending notifications failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)
