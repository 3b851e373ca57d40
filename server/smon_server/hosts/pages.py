"""What the hosts API serves: a sorted, paged list of hosts and one host's whole story."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from smon_server.hosts.fleet import (
    DAY,
    PERIOD_DAYS,
    Policy,
    blank,
    figures,
    recommendation,
    summary_figures,
    verdict,
)
from smon_server.store.models import HostGpuEvent, HostIncident, HostJob, HostSummary
from smon_server.views.hosts import list_row

SortKey = Literal[
    "suspect",
    "host",
    "jobs",
    "straggler_jobs",
    "gpu_hours_lost",
    "gpu_faults",
    "throttle_seconds",
    "last_incident",
]
# Ties broken by the default order, then the name, so pages never overlap.
_DEFAULT = ("suspect", "straggler_jobs", "gpu_hours_lost")


def page(
    session: Session,
    *,
    now: float,
    policy: Policy,
    since: float | None,
    suspect: bool | None,
    contains: str | None,
    sort: SortKey,
    descending: bool,
    limit: int,
    offset: int,
) -> tuple[list[str], int, float]:
    """(the page's rows as JSON text, hosts in all, the period's start). Without `since`: the
    stored default-period figures, sorted and paged in the database; with it: aggregated now."""
    keys = [sort, *(k for k in _DEFAULT if k != sort)]
    if since is None:
        start = now - PERIOD_DAYS * DAY
        where = [HostSummary.last_seen >= start]
        if suspect is not None:
            where.append(HostSummary.suspect.is_(suspect))
        if contains:
            where.append(HostSummary.host.contains(contains, autoescape=True))
        total = int(session.scalar(select(func.count()).select_from(HostSummary).where(*where)) or 0)
        order = []
        for k in keys:
            column = getattr(HostSummary, k)
            column = column.desc() if descending else column.asc()
            order.append(column.nulls_last() if k == "last_incident" else column)
        # Ties by name in the same direction: the default order is then one backward scan of
        # ix_host_summaries_order (the newest page of 10,000 hosts reads ~100 rows, not all).
        order.append(HostSummary.host.desc() if descending else HostSummary.host.asc())
        # The page's names first, sorting only the sort keys (not every row's JSON), then its rows.
        names = list(
            session.scalars(
                select(HostSummary.host).where(*where).order_by(*order).limit(limit).offset(offset)
            )
        )
        stmt = select(HostSummary.host, HostSummary.row_json).where(HostSummary.host.in_(names))
        rows = {host: text for host, text in session.execute(stmt)}
        return [rows[h] for h in names if h in rows], total, start
    figs = [
        f
        for f in figures(session, since=since, now=now, policy=policy).values()
        if (suspect is None or f["suspect"] is suspect) and (not contains or contains in f["host"])
    ]

    def key(f: dict[str, Any]) -> tuple[Any, ...]:
        values = []
        for k in keys:
            v = f[k]
            if k == "last_incident":
                v = float("-inf") if v is None else v
            values.append(v)
        return tuple(values)

    figs.sort(key=lambda f: (*key(f), f["host"]), reverse=descending)
    return [list_row(f) for f in figs[offset : offset + limit]], len(figs), since


def detail(
    session: Session, *, host: str, now: float, policy: Policy, since: float | None, limit: int
) -> dict[str, Any] | None:
    """The host's figures, verdict and recommendation, its incidents newest first, the jobs it
    ran and its GPUs' health events; None when nothing is stored about it at all."""
    start = now - PERIOD_DAYS * DAY if since is None else since
    stored = session.get(HostSummary, host) if since is None else None
    if stored is not None:  # the default period: the figures the list and the alert read
        f: dict[str, Any] | None = summary_figures(stored)
    else:
        f = figures(session, since=start, now=now, policy=policy, hosts=[host]).get(host)
    if f is None:
        known = session.scalar(select(HostJob.host).where(HostJob.host == host).limit(1)) or session.scalar(
            select(HostIncident.host).where(HostIncident.host == host).limit(1)
        )
        if not known:
            return None
        f = blank(host, 0)
    incidents = session.scalars(
        select(HostIncident)
        .where(HostIncident.host == host, HostIncident.last_seen >= start)
        .order_by(HostIncident.last_seen.desc(), HostIncident.id.desc())
        .limit(limit)
    ).all()
    jobs = session.scalars(
        select(HostJob)
        .where(HostJob.host == host, HostJob.last_seen >= start)
        .order_by(HostJob.last_seen.desc())
        .limit(limit)
    ).all()
    events = session.scalars(
        select(HostGpuEvent)
        .where(HostGpuEvent.host == host, HostGpuEvent.time >= start)
        .order_by(HostGpuEvent.time.desc(), HostGpuEvent.id.desc())
        .limit(limit * 5)
    ).all()
    gpus: dict[str, list[dict[str, Any]]] = {uuid: [] for j in jobs for uuid in j.gpus or []}
    for e in events:
        gpus.setdefault(e.gpu_uuid, []).append(
            {
                "time": e.time,
                "kind": e.kind,
                "code": e.code,
                "reason": e.reason or None,
                "value": e.value,
                "job_id": e.job_id,
                "rank": e.rank,
            }
        )
    suspect_since = now - policy.suspect_days * DAY
    return {
        **f,
        "since": start,
        "verdict": verdict(f, policy),
        "recommendation": recommendation(f)
        if f["suspect"] or f["straggler_jobs"] or f["gpu_faults"]
        else None,
        "rule": {"min_jobs": policy.suspect_jobs, "days": policy.suspect_days},
        "incidents": [
            {
                "job_id": i.job_id,
                "attempt": i.attempt,
                "rank": i.rank,
                "gpu_uuid": i.gpu_uuid,
                "cause": i.cause,
                "slowdown": i.slowdown,
                "job_slowdown": i.job_slowdown,
                "gpu_hours_lost": i.gpu_hours_lost,
                "evidence": i.evidence or {},
                "first_seen": i.first_seen,
                "last_seen": i.last_seen,
                "counts_toward_suspect": i.last_seen >= suspect_since,
            }
            for i in incidents
        ],
        "jobs_run": [
            {
                "job_id": j.job_id,
                "attempt": j.attempt,
                "ranks": j.ranks,
                "first_seen": j.first_seen,
                "last_seen": j.last_seen,
            }
            for j in jobs
        ],
        "gpus": [{"gpu_uuid": uuid, "events": evs} for uuid, evs in sorted(gpus.items())],
    }
