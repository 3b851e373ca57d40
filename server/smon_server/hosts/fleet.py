"""Each host's figures over a period, the suspect rule, and what to do about a suspect host.

`figures` aggregates the rollups (host_jobs, host_incidents, host_gpu_events) in the database for
any period. The default period's figures are also stored per host (`host_summaries`), refreshed
by the analysis loop for the hosts a pass touched and for every host every few minutes (so a
host's old incidents age out of the period and of the suspect rule): `GET /hosts`, the host
metrics and the `host_suspect` rule read those, so they agree and a fleet of 10,000 hosts is one
sorted read. A period asked for explicitly is aggregated on the spot.

The suspect rule (docs/hosts.md): a host charged with stragglers in at least `suspect_jobs`
distinct jobs (attempts of one job count once) within the last `suspect_days` days.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Integer, cast, delete, distinct, func, select
from sqlalchemy.orm import Session

from smon_server.hosts.gpu_events import POWER, THERMAL
from smon_server.settings import Settings
from smon_server.store.models import HostGpuEvent, HostIncident, HostJob, HostSummary
from smon_server.views.hosts import list_row

DAY = 86_400.0
PERIOD_DAYS = 7.0  # GET /hosts without `since`, and the stored summaries
FULL_REFRESH_SECONDS = 300.0
MAX_BINS = 30  # sparkline points at most
XIDS_SHOWN = 10  # newest XIDs per host in a list row


@dataclass(frozen=True)
class Policy:
    suspect_jobs: int = 3
    suspect_days: float = 7.0

    @classmethod
    def of(cls, settings: Settings) -> Policy:
        return cls(settings.host_suspect_jobs, settings.host_suspect_days)


def _only(column: Any, hosts: Collection[str] | None) -> list[Any]:
    return [] if hosts is None else [column.in_(sorted(hosts))]


def figures(
    session: Session, *, since: float, now: float, policy: Policy, hosts: Collection[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per host seen since `since` (of `hosts`, or all): jobs run, jobs it straggled in, the
    GPU-hours they lost to it, its causes, its GPUs' health events, and the suspect verdict."""
    out: dict[str, dict[str, Any]] = {}
    bins = min(MAX_BINS, max(1, math.ceil((now - since) / DAY - 1e-9)))
    width = max(now - since, 1.0) / bins

    def entry(host: str) -> dict[str, Any]:
        if host not in out:
            out[host] = blank(host, bins)
        return out[host]

    def seen(e: dict[str, Any], first: float | None, last: float | None) -> None:
        if first is not None:
            e["first_seen"] = first if e["first_seen"] is None else min(e["first_seen"], first)
        if last is not None:
            e["last_seen"] = last if e["last_seen"] is None else max(e["last_seen"], last)

    ran = session.execute(
        select(
            HostJob.host,
            func.count(distinct(HostJob.job_id)),
            func.min(HostJob.first_seen),
            func.max(HostJob.last_seen),
        )
        .where(HostJob.last_seen >= since, *_only(HostJob.host, hosts))
        .group_by(HostJob.host)
    )
    for host, jobs, first, last in ran:
        e = entry(host)
        e["jobs"] = int(jobs)
        seen(e, first, last)
    charged = session.execute(
        select(
            HostIncident.host,
            func.count(distinct(HostIncident.job_id)),
            func.sum(HostIncident.gpu_hours_lost),
            func.min(HostIncident.first_seen),
            func.max(HostIncident.last_seen),
        )
        .where(HostIncident.last_seen >= since, *_only(HostIncident.host, hosts))
        .group_by(HostIncident.host)
    )
    for host, jobs, hours, first, last in charged:
        e = entry(host)
        e["straggler_jobs"], e["gpu_hours_lost"], e["last_incident"] = int(jobs), float(hours or 0.0), last
        seen(e, first, last)
    causes: dict[str, Counter[str]] = {}
    for host, cause, jobs in session.execute(
        select(HostIncident.host, HostIncident.cause, func.count(distinct(HostIncident.job_id)))
        .where(HostIncident.last_seen >= since, *_only(HostIncident.host, hosts))
        .group_by(HostIncident.host, HostIncident.cause)
    ):
        causes.setdefault(host, Counter())[cause] = int(jobs)
    for host, counts in causes.items():
        entry(host)["causes"] = [
            {"cause": c, "jobs": n} for c, n in sorted(counts.items(), key=lambda x: (-x[1], x[0]))
        ]
    day = cast((HostIncident.last_seen - since) / width, Integer)
    for host, at, count in session.execute(
        select(HostIncident.host, day, func.count())
        .where(HostIncident.last_seen >= since, *_only(HostIncident.host, hosts))
        .group_by(HostIncident.host, day)
    ):
        entry(host)["incidents_by_day"][min(bins - 1, max(0, int(at)))] += int(count)
    for host, jobs in session.execute(
        select(HostIncident.host, func.count(distinct(HostIncident.job_id)))
        .where(HostIncident.last_seen >= now - policy.suspect_days * DAY, *_only(HostIncident.host, hosts))
        .group_by(HostIncident.host)
    ):
        e = entry(host)
        e["suspect_jobs"] = int(jobs)
        e["suspect"] = int(jobs) >= policy.suspect_jobs
    _add_events(session, since, hosts, entry, seen)
    return out


def blank(host: str, bins: int) -> dict[str, Any]:
    """A host's figures when nothing happened on it in the period."""
    return {
        "host": host,
        "jobs": 0,
        "straggler_jobs": 0,
        "gpu_hours_lost": 0.0,
        "causes": [],
        "gpu_events": _no_events(),
        "gpu_faults": 0,
        "throttle_seconds": 0.0,
        "last_incident": None,
        "suspect": False,
        "suspect_jobs": 0,
        "incidents_by_day": [0] * bins,
        "first_seen": None,
        "last_seen": None,
    }


def _no_events() -> dict[str, Any]:
    return {"xid": [], "xid_count": 0, "ecc_uncorrected": 0, "throttle_seconds": {}, "gpus": {}}


def _add_events(session: Session, since: float, hosts: Collection[str] | None, entry: Any, seen: Any) -> None:
    totals = session.execute(
        select(
            HostGpuEvent.host,
            HostGpuEvent.gpu_uuid,
            HostGpuEvent.kind,
            HostGpuEvent.reason,
            func.count(),
            func.sum(HostGpuEvent.value),
            func.min(HostGpuEvent.time),
            func.max(HostGpuEvent.time),
        )
        .where(HostGpuEvent.time >= since, *_only(HostGpuEvent.host, hosts))
        .group_by(HostGpuEvent.host, HostGpuEvent.gpu_uuid, HostGpuEvent.kind, HostGpuEvent.reason)
    )
    for host, uuid, kind, reason, count, value, first, last in totals:
        e = entry(host)
        seen(e, first, last)
        events = e["gpu_events"]
        gpu = events["gpus"].setdefault(uuid, {"xid_count": 0, "ecc_uncorrected": 0, "throttle_seconds": {}})
        if kind == "xid":
            events["xid_count"] += int(count)
            gpu["xid_count"] += int(count)
            e["gpu_faults"] += int(count)
        elif kind == "ecc_uncorrected":
            events["ecc_uncorrected"] += int(value or 0)
            gpu["ecc_uncorrected"] += int(value or 0)
            e["gpu_faults"] += int(value or 0)
        elif kind == "throttle":
            seconds = float(value or 0.0)
            events["throttle_seconds"][reason] = events["throttle_seconds"].get(reason, 0.0) + seconds
            gpu["throttle_seconds"][reason] = gpu["throttle_seconds"].get(reason, 0.0) + seconds
            e["throttle_seconds"] += seconds
    xids = session.execute(
        select(HostGpuEvent.host, HostGpuEvent.gpu_uuid, HostGpuEvent.code, HostGpuEvent.time)
        .where(HostGpuEvent.kind == "xid", HostGpuEvent.time >= since, *_only(HostGpuEvent.host, hosts))
        .order_by(HostGpuEvent.time.desc())
    )
    for host, uuid, code, at in xids:
        shown = entry(host)["gpu_events"]["xid"]
        if len(shown) < XIDS_SHOWN:
            shown.append({"code": int(code or 0), "time": float(at), "gpu_uuid": uuid})


def recommendation(f: dict[str, Any]) -> str:
    """What to do about the host, from what its evidence shows (docs/hosts.md)."""
    host, events = f["host"], f["gpu_events"]
    faulty = sorted(u for u, g in events["gpus"].items() if g["xid_count"] or g["ecc_uncorrected"])
    throttle = events["throttle_seconds"]
    thermal = sum(s for r, s in throttle.items() if r in THERMAL)
    power = sum(s for r, s in throttle.items() if r in POWER)
    if faulty:
        codes = sorted({x["code"] for x in events["xid"]})
        what = ", ".join(
            [
                *([f"XID {', '.join(map(str, codes))}"] if codes else []),
                *(
                    [f"{events['ecc_uncorrected']} new uncorrectable ECC errors"]
                    if events["ecc_uncorrected"]
                    else []
                ),
            ]
        )
        return (
            f"Drain {host} and run the vendor's diagnostics on GPU {', '.join(faulty) or '?'} "
            f"(NVIDIA: `dcgmi diag -r 3`); it reported {what}. Return it only after the GPU passes "
            "or is replaced."
        )
    if thermal > 0 and thermal >= power:
        return (
            f"Check the cooling of {host} (fans, airflow, inlet temperature): its GPUs throttled "
            f"{thermal:.0f} s for thermal reasons while it slowed jobs."
        )
    if power > 0:
        return (
            f"Check power capping and power delivery of {host} (`nvidia-smi -q -d POWER`, PSU, rack "
            f"budget): its GPUs throttled {power:.0f} s for power reasons while it slowed jobs."
        )
    lead = f["causes"][0]["cause"] if f["causes"] else ""
    if lead in ("data_loader", "host_work"):
        return (
            f"{host}'s GPUs report healthy telemetry, but its ranks were slow on the host side "
            f"({lead}): check its CPUs, memory, local disks and network, then compare it in a "
            "burn-in against its peers before it takes jobs again."
        )
    return (
        f"{host}'s GPU telemetry looks healthy, yet its ranks straggled: drain it and compare it in "
        "a burn-in against its peers (same GPU model, same benchmark; GPU memory bandwidth, "
        "NVLink/PCIe, NIC) before it takes jobs again."
    )


def verdict(f: dict[str, Any], policy: Policy) -> str:
    """Why the host is or is not suspect, in one sentence."""
    n, days = f["suspect_jobs"], f"{policy.suspect_days:g}"
    if f["suspect"]:
        return (
            f"Suspect: its own ranks straggled in {n} distinct jobs within {days} days "
            f"(the rule: {policy.suspect_jobs} or more)."
        )
    if n:
        return (
            f"Not suspect: its ranks straggled in {n} distinct job(s) within {days} days; "
            f"{policy.suspect_jobs} are needed, so it may be the job's fault or chance."
        )
    return f"Not suspect: none of its ranks straggled within {days} days."


def refresh(session: Session, *, now: float, policy: Policy, hosts: Collection[str] | None = None) -> int:
    """The stored default-period figures of `hosts` (or of every host, dropping those no longer
    seen in the period) brought up to date; returns how many rows were written."""
    figs = figures(session, since=now - PERIOD_DAYS * DAY, now=now, policy=policy, hosts=hosts)
    stored = {r.host: r for r in session.scalars(select(HostSummary).where(*_only(HostSummary.host, hosts)))}
    for host, f in figs.items():
        row = stored.get(host)
        if row is None:
            row = HostSummary(host=host)
            session.add(row)
        row.first_seen = f["first_seen"] if f["first_seen"] is not None else now
        row.last_seen = f["last_seen"] if f["last_seen"] is not None else now
        for name in (
            "jobs",
            "straggler_jobs",
            "gpu_hours_lost",
            "gpu_faults",
            "throttle_seconds",
            "last_incident",
            "suspect",
            "suspect_jobs",
            "causes",
            "gpu_events",
            "incidents_by_day",
        ):
            setattr(row, name, f[name])
        row.row_json = list_row(f)
        row.refreshed_at = now
    gone = [h for h in stored if h not in figs]
    if gone:
        session.execute(delete(HostSummary).where(HostSummary.host.in_(gone)))
    return len(figs)


def expire(session: Session, *, before: float) -> int:
    """Delete host history that ended before `before` (SMON_HOST_HISTORY_DAYS): incidents, GPU
    events and host-job rows; a host's stored figures go with its next full refresh, once it was
    seen in no job of the period. Returns how many rows were deleted."""
    deleted = 0
    for statement in (
        delete(HostIncident).where(HostIncident.last_seen < before),
        delete(HostGpuEvent).where(HostGpuEvent.time < before),
        delete(HostJob).where(HostJob.last_seen < before),
    ):
        deleted += int(getattr(session.execute(statement), "rowcount", 0) or 0)
    return deleted


def summary_figures(row: HostSummary) -> dict[str, Any]:
    """A stored summary in the shape `figures` returns."""
    return {
        "host": row.host,
        "jobs": row.jobs,
        "straggler_jobs": row.straggler_jobs,
        "gpu_hours_lost": row.gpu_hours_lost,
        "causes": row.causes or [],
        "gpu_events": row.gpu_events or _no_events(),
        "gpu_faults": row.gpu_faults,
        "throttle_seconds": row.throttle_seconds,
        "last_incident": row.last_incident,
        "suspect": row.suspect,
        "suspect_jobs": row.suspect_jobs,
        "incidents_by_day": row.incidents_by_day or [],
        "first_seen": row.first_seen,
        "last_seen": row.last_seen,
    }
