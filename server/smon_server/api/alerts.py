"""/api/v1/alerts and /api/v1/silences: incidents, acknowledging them, keeping them quiet."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field
from sqlalchemy import select

from smon_server.alerts import outbox
from smon_server.api.deps import ApiTokenDep, ContextDep, DbDep, RowId
from smon_server.api.schemas import utc
from smon_server.store.models import Alert, Notification, Silence

router = APIRouter(prefix="/api/v1", tags=["alerts"])


def _ts(seconds: float | None) -> datetime | None:
    return None if seconds is None else utc(seconds)


class AlertOut(BaseModel):
    id: int
    dedup_key: str = Field(description="stable per (job, rule[, host]) incident: smon/<job>/<rule>[/<host>]")
    rule: str
    job_id: str
    host: str
    severity: str
    state: str = Field(description="pending, firing or resolved")
    summary: str
    details: dict[str, object]
    started_at: datetime | None
    fired_at: datetime | None
    resolved_at: datetime | None
    acked_at: datetime | None
    acked_by: str
    silenced: bool

    @classmethod
    def of(cls, a: Alert) -> AlertOut:
        return cls(
            id=a.id,
            dedup_key=a.dedup_key,
            rule=a.rule,
            job_id=a.job_id,
            host=a.host,
            severity=a.severity,
            state=a.state,
            summary=a.summary,
            details=a.details or {},
            started_at=_ts(a.started_at),
            fired_at=_ts(a.fired_at),
            resolved_at=_ts(a.resolved_at),
            acked_at=_ts(a.acked_at),
            acked_by=a.acked_by,
            silenced=a.silenced,
        )


class AlertsOut(BaseModel):
    alerts: list[AlertOut]


class NotificationOut(BaseModel):
    notifier: str
    event: str
    created_at: datetime | None
    attempts: int
    sent_at: datetime | None
    last_error: str


class AlertDetailOut(AlertOut):
    notifications: list[NotificationOut] = Field(description="every message sent or being retried")


# Text that reaches a PostgreSQL text column: no NUL (the database refuses it outright).
_NO_NUL = r"^[^\x00]*$"
Pattern = Annotated[str, Field(max_length=256, pattern=_NO_NUL)]


class AckIn(BaseModel):
    by: str = Field(
        "", max_length=256, pattern=_NO_NUL, description="who acknowledges (shown with the alert)"
    )


class SilenceIn(BaseModel):
    matchers: dict[Literal["job", "rule", "host"], Pattern] = Field(
        min_length=1, description="fnmatch patterns on the alert's labels, all of which must match"
    )
    duration_seconds: float = Field(gt=0, le=90 * 86400)
    created_by: str = Field("", max_length=256, pattern=_NO_NUL)
    comment: str = Field("", max_length=1024, pattern=_NO_NUL)


class SilenceOut(BaseModel):
    id: int
    matchers: dict[str, str]
    starts_at: datetime | None
    ends_at: datetime | None
    created_by: str
    comment: str
    active: bool

    @classmethod
    def of(cls, s: Silence, now: float) -> SilenceOut:
        return cls(
            id=s.id,
            matchers={str(k): str(v) for k, v in (s.matchers or {}).items()},
            starts_at=_ts(s.starts_at),
            ends_at=_ts(s.ends_at),
            created_by=s.created_by,
            comment=s.comment,
            active=s.starts_at <= now < s.ends_at,
        )


class SilencesOut(BaseModel):
    silences: list[SilenceOut]


@router.get("/alerts", response_model=AlertsOut)
def list_alerts(
    db: DbDep,
    _auth: ApiTokenDep,
    job: Annotated[str | None, Query(max_length=256)] = None,
    state: Annotated[Literal["pending", "firing", "resolved", "open"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> AlertsOut:
    """Newest first; `open` is pending or firing."""
    stmt = select(Alert)
    if job is not None:
        stmt = stmt.where(Alert.job_id == job)
    if state == "open":
        stmt = stmt.where(Alert.state.in_(("pending", "firing")))
    elif state is not None:
        stmt = stmt.where(Alert.state == state)
    rows = db.scalars(stmt.order_by(Alert.id.desc()).limit(limit)).all()
    return AlertsOut(alerts=[AlertOut.of(a) for a in rows])


@router.get("/alerts/{alert_id}", response_model=AlertDetailOut)
def get_alert(alert_id: RowId, db: DbDep, _auth: ApiTokenDep) -> AlertDetailOut:
    """One incident with its notifications: did the page go out, and if not, why."""
    alert = db.get(Alert, alert_id)
    if alert is None:
        raise HTTPException(status_code=404, detail=f"no alert {alert_id}")
    sent = db.scalars(select(Notification).where(Notification.alert_id == alert_id).order_by(Notification.id))
    return AlertDetailOut(
        **AlertOut.of(alert).model_dump(),
        notifications=[
            NotificationOut(
                notifier=n.notifier,
                event=n.event,
                created_at=_ts(n.created_at),
                attempts=n.attempts,
                sent_at=_ts(n.sent_at),
                last_error=n.last_error,
            )
            for n in sent
        ],
    )


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut)
def acknowledge(alert_id: RowId, body: AckIn, db: DbDep, context: ContextDep, _auth: ApiTokenDep) -> AlertOut:
    """Acknowledged here and, where the incident was paged, in PagerDuty."""
    alert = db.get(Alert, alert_id)
    if alert is None:
        raise HTTPException(status_code=404, detail=f"no alert {alert_id}")
    if alert.acked_at is None:
        now = time.time()
        alert.acked_at, alert.acked_by = now, body.by
        if alert.state == "firing":
            outbox.enqueue(
                db, alert, "acknowledged", context.notifiers, public_url=context.settings.public_url, now=now
            )
        db.commit()
    return AlertOut.of(alert)


@router.get("/silences", response_model=SilencesOut)
def list_silences(db: DbDep, _auth: ApiTokenDep) -> SilencesOut:
    now = time.time()
    rows = db.scalars(select(Silence).order_by(Silence.id.desc()).limit(500)).all()
    return SilencesOut(silences=[SilenceOut.of(s, now) for s in rows])


@router.post("/silences", response_model=SilenceOut, status_code=201)
def create_silence(body: SilenceIn, db: DbDep, _auth: ApiTokenDep) -> SilenceOut:
    now = time.time()
    silence = Silence(
        matchers=dict(body.matchers),
        starts_at=now,
        ends_at=now + body.duration_seconds,
        created_by=body.created_by,
        comment=body.comment,
    )
    db.add(silence)
    db.commit()
    return SilenceOut.of(silence, now)


@router.delete("/silences/{silence_id}", response_model=SilenceOut)
def expire_silence(silence_id: RowId, db: DbDep, _auth: ApiTokenDep) -> SilenceOut:
    """Ends the silence now (kept for the record)."""
    silence = db.get(Silence, silence_id)
    if silence is None:
        raise HTTPException(status_code=404, detail=f"no silence {silence_id}")
    now = time.time()
    silence.ends_at = min(silence.ends_at, now)
    db.commit()
    return SilenceOut.of(silence, now)
