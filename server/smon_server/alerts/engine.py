"""One evaluation of every rule over the stored analyses, moving incidents through their lifecycle.

pending (condition true, not yet for `for`) → firing → resolved (condition false for
`keep_firing_for`). A condition that clears while pending drops the incident without a page. The
lifecycle lives in the `alerts` table, so a restarted server picks up where it left off, and one
replica evaluates at a time (a PostgreSQL advisory lock). Flagged analyses (the replay misses the
measured steps by > 5 %) and warm-up windows (no S yet) never page.

Rules are evaluated on each job's newest attempt (a restart under the same id, store/attempts.py):
an incident is per (job, rule[, host]), not per attempt, so a condition that holds across a
restart stays one incident (the restart did not fix it: nobody is paged twice), an incident that
resolved in an old attempt stays resolved, and the old attempt's stored analysis is never read
again. The incident's details name the attempt it was last true in.

`evaluate` returns the transitions (fired, resolved) for notifiers to send.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.alerts.rules import Rule
from smon_server.hosts.fleet import DAY, Policy, recommendation, summary_figures
from smon_server.store import queries
from smon_server.store.leases import try_lease
from smon_server.store.models import Alert, AlertCounter, HostIncident, HostSummary, Job, Silence

OPEN = ("pending", "firing")
LEASE = "smon:alert-evaluation"  # one lease for the whole evaluation, beside the per-job ones


@dataclass(frozen=True)
class Condition:
    rule: Rule
    job_id: str
    host: str
    severity: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    attempt: int | None = None  # the job attempt it holds in (its newest); None: job-wide

    @property
    def key(self) -> str:
        return "/".join(["smon", self.job_id, self.rule.name, *([self.host] if self.host else [])])


@dataclass(frozen=True)
class Transition:
    alert_id: int
    kind: str  # "firing" or "resolved"


def conditions(
    rows: Sequence[queries.JobListRow],
    rules: Sequence[Rule],
    *,
    now: float,
    stall_seconds: float,
    session: Session | None = None,
) -> list[Condition]:
    """The rules' conditions that hold now, one per (job, rule[, host])."""
    by_name = {r.name: r for r in rules if r.enabled}
    found: list[Condition] = []
    for row in rows:
        job, result = row.job, row.result
        name = _job_name(job.job_id, job.attempt)
        rule = by_name.get("ranks_not_reporting")
        quiet = row.quietest is not None and now - row.quietest > stall_seconds
        if rule and quiet and row.live_state == "running" and session is not None:
            silent = queries.silent_ranks(session=session, job=job, before=now - stall_seconds)
            if silent:
                found.append(
                    Condition(
                        rule,
                        job.job_id,
                        "",
                        rule.severity,
                        f"{len(silent)} rank(s) of job {name} stopped reporting: "
                        + ", ".join(f"rank {r} on {h or '?'}" for r, h in silent[:8]),
                        {"ranks": [r for r, _ in silent], "hosts": sorted({h for _, h in silent})},
                        job.attempt,
                    )
                )
        rule = by_name.get("job_stalled")
        if rule and row.live_state == "stalled":
            where = _hang_evidence(session, job.job_id, job.attempt) if session is not None else {}
            suspects = f": suspect rank(s) {where['suspect_ranks']}" if where.get("suspect_ranks") else ""
            found.append(
                Condition(
                    rule,
                    job.job_id,
                    "",
                    rule.severity,
                    f"Job {name} is alive but no step completes{suspects}",
                    where,
                    job.attempt,
                )
            )
        if result is None or result.flagged or row.live_state != "running":
            continue
        rule = by_name.get("job_straggling")
        s = result.recent_slowdown if result.recent_slowdown is not None else result.slowdown
        if rule and rule.threshold is not None and s is not None and s >= rule.threshold:
            critical = rule.critical_threshold is not None and s >= rule.critical_threshold
            worst = (result.recent_stragglers or [{}])[0] or {}
            found.append(
                Condition(
                    rule,
                    job.job_id,
                    "",
                    "critical" if critical else rule.severity,
                    f"Job {name} runs {s:.2f}x slower than it would without stragglers",
                    {
                        "slowdown": s,
                        "window_slowdown": result.slowdown,
                        "waste_fraction": result.waste_fraction,
                        "worst_rank": worst.get("rank", result.worst_rank),
                        "worst_host": worst.get("host"),
                        "cause": worst.get("cause") or result.leading_cause or None,
                    },
                    job.attempt,
                )
            )
        stragglers = result.recent_stragglers or []
        rule = by_name.get("gpu_unhealthy")
        if rule:
            sick = [x for x in stragglers if x.get("cause") == "gpu_throttling"]
            found += _per_host(
                rule, job, sick, "GPU of rank(s) {ranks} on {host} throttles and slows job {job}"
            )
        rule = by_name.get("worker_straggling")
        if rule:
            found += _per_host(rule, job, stragglers, "Rank(s) {ranks} on {host} straggle in job {job}")
    return found


def _job_name(job_id: str, attempt: int) -> str:
    """The job as a page names it: its id, and its attempt once it was restarted."""
    return job_id if attempt == 1 else f"{job_id} (attempt {attempt})"


def _per_host(rule: Rule, job: Job, stragglers: Sequence[dict[str, Any]], text: str) -> list[Condition]:
    """One condition per host of `stragglers` ([{rank, host, cause}]), naming its ranks."""
    hosts: dict[str, list[int]] = {}
    for s in stragglers:
        hosts.setdefault(str(s.get("host", "")), []).append(int(s["rank"]))
    name = _job_name(job.job_id, job.attempt)
    return [
        Condition(
            rule,
            job.job_id,
            host,
            rule.severity,
            text.format(ranks=", ".join(map(str, ranks)), host=host or "an unknown host", job=name),
            {"ranks": ranks},
            job.attempt,
        )
        for host, ranks in hosts.items()
    ]


def _dropping(
    session: Session, rows: Sequence[queries.JobListRow], rules: Sequence[Rule], now: float
) -> list[Condition]:
    """Jobs whose agents' dropped-record counters grew within the rule's window."""
    rule = next((r for r in rules if r.name == "agents_dropping_records" and r.enabled), None)
    if rule is None or not rows:
        return []
    window = rule.threshold or 600.0
    totals = queries.dropped_records(session=session, job_ids=[r.job.job_id for r in rows])
    dropping = [job for job, total in totals.items() if total > 0]
    counters = {
        c.job_id: c
        for c in session.scalars(
            select(AlertCounter).where(
                AlertCounter.name == "dropped_records", AlertCounter.job_id.in_(dropping)
            )
        )
    }
    out = []
    for job_id in dropping:
        total = totals[job_id]
        seen = counters.get(job_id)
        if seen is None:
            seen = AlertCounter(job_id=job_id, name="dropped_records", value=0, changed_at=0.0)
            session.add(seen)
        grown = max(0, total - seen.value)
        if grown:
            seen.value, seen.changed_at = total, now
        if seen.changed_at and now - seen.changed_at < window:
            out.append(
                Condition(
                    rule,
                    job_id,
                    "",
                    rule.severity,
                    f"Agents of job {job_id} are dropping records ({total} so far): "
                    "SMon's view of it has gaps",
                    {"dropped_records": total, "new_since_last_check": grown},
                )
            )
    return out


def _gpu_faults(
    session: Session, rows: Sequence[queries.JobListRow], rules: Sequence[Rule], now: float
) -> list[Condition]:
    rule = next((r for r in rules if r.name == "gpu_fault" and r.enabled), None)
    running = [r.job.job_id for r in rows if r.live_state != "finished"]
    if rule is None or not running:
        return []
    faults = queries.gpu_faults(session=session, job_ids=running, since=now - (rule.threshold or 600.0))
    by_host: dict[tuple[str, str], list[tuple[int, list[int], int]]] = {}
    for job_id, rank, host, xids, ecc in faults:
        by_host.setdefault((job_id, host), []).append((rank, xids, ecc))
    out = []
    for (job_id, host), gpus in by_host.items():
        what = "; ".join(
            f"rank {rank}: "
            + ", ".join([*(f"XID {x}" for x in xids), *([f"{ecc} uncorrectable ECC"] if ecc else [])])
            for rank, xids, ecc in gpus
        )
        out.append(
            Condition(
                rule,
                job_id,
                host,
                rule.severity,
                f"GPU fault on {host or 'an unknown host'} in job {job_id}: {what}",
                {"gpus": [{"rank": r, "xid": x, "ecc_uncorrected": e} for r, x, e in gpus]},
            )
        )
    return out


def _suspect_hosts(
    session: Session, rules: Sequence[Rule], now: float, policy: Policy | None
) -> list[Condition]:
    """One condition per suspect host (its stored figures) with a straggler incident within the
    rule's clean period: the host, its GPUs, the jobs it slowed and what to do."""
    rule = next((r for r in rules if r.name == "host_suspect" and r.enabled), None)
    if rule is None:
        return []
    clean = rule.threshold if rule.threshold is not None else 86_400.0
    policy = policy or Policy()
    suspects = list(
        session.scalars(
            select(HostSummary)
            .where(HostSummary.suspect.is_(True), HostSummary.last_incident >= now - clean)
            .order_by(HostSummary.host)
        )
    )
    # Their incidents within the rule's days in one read, newest first (50 a host at most).
    by_host: dict[str, list[HostIncident]] = {}
    if suspects:
        for i in session.scalars(
            select(HostIncident)
            .where(
                HostIncident.host.in_([r.host for r in suspects]),
                HostIncident.last_seen >= now - policy.suspect_days * DAY,
            )
            .order_by(HostIncident.last_seen.desc())
        ):
            kept = by_host.setdefault(i.host, [])
            if len(kept) < 50:
                kept.append(i)
    out = []
    for row in suspects:
        f = summary_figures(row)
        incidents = by_host.get(row.host, [])
        jobs = [
            {
                "job_id": i.job_id,
                "rank": i.rank,
                "gpu_uuid": i.gpu_uuid,
                "cause": i.cause,
                "slowdown": i.slowdown,
            }
            for i in incidents
        ]
        gpus = sorted(
            {i.gpu_uuid for i in incidents if i.gpu_uuid}
            | set((f["gpu_events"].get("gpus") or {}).keys()) - {""}
        )
        events = f["gpu_events"]
        out.append(
            Condition(
                rule,
                "",
                row.host,
                rule.severity,
                f"Host {row.host} slowed {row.suspect_jobs} distinct jobs within "
                f"{policy.suspect_days:g} days: " + ", ".join(sorted({i.job_id for i in incidents})[:5]),
                {
                    "host": row.host,
                    "gpus": gpus,
                    "jobs": jobs,
                    "straggler_jobs": row.suspect_jobs,
                    "causes": f["causes"],
                    "gpu_events": {
                        k: events.get(k) for k in ("xid", "xid_count", "ecc_uncorrected", "throttle_seconds")
                    },
                    "cause": f["causes"][0]["cause"] if f["causes"] else None,
                    "recommendation": recommendation(f),
                },
            )
        )
    return out


def _hang_evidence(session: Session, job_id: str, attempt: int) -> dict[str, Any]:
    """Where each rank stands, from the hang diagnosis of the job attempt's stored analysis
    (which the loop refreshes as soon as a job stalls)."""
    parts = queries.result_parts(session=session, job_id=job_id, attempt=attempt, parts=["summary"]) or {}
    for d in (parts.get("summary") or {}).get("diagnoses") or []:
        if d.get("cause") == "hang":
            return dict(d.get("evidence") or {})
    return {}


def silenced(alert: Alert, silences: Sequence[Silence], now: float) -> bool:
    labels = {"job": alert.job_id, "rule": alert.rule, "host": alert.host}
    return any(
        s.starts_at <= now < s.ends_at
        and all(fnmatch.fnmatchcase(labels.get(k, ""), str(v)) for k, v in (s.matchers or {}).items())
        for s in silences
    )


def evaluate(
    session: Session,
    *,
    now: float,
    rules: Sequence[Rule],
    stall_seconds: float,
    horizon: float,
    host_policy: Policy | None = None,
) -> list[Transition] | None:
    """Evaluate every rule once; None when another replica holds the evaluation lease."""
    if not try_lease(session, LEASE):
        return None
    rows = queries.exported_jobs(
        session=session, now=now, stall_seconds=stall_seconds, seen_since=now - horizon
    )
    found = conditions(rows, rules, now=now, stall_seconds=stall_seconds, session=session)
    found += _dropping(session, rows, rules, now)
    found += _gpu_faults(session, rows, rules, now)
    found += _suspect_hosts(session, rules, now, host_policy)
    holding = {c.key: c for c in found}
    open_alerts = {a.dedup_key: a for a in session.scalars(select(Alert).where(Alert.state.in_(OPEN)))}
    active_silences = session.scalars(select(Silence).where(Silence.ends_at > now)).all()
    by_name = {r.name: r for r in rules}
    transitions: list[Alert] = []
    resolved: list[Alert] = []
    touched: list[Alert] = list(open_alerts.values())
    for key, cond in holding.items():
        alert = open_alerts.get(key)
        if alert is None:
            alert = Alert(
                dedup_key=key,
                rule=cond.rule.name,
                job_id=cond.job_id,
                host=cond.host,
                state="pending",
                started_at=now,
                acked_by="",
            )
            session.add(alert)
            touched.append(alert)
        alert.last_true_at = now
        alert.severity = cond.severity
        alert.summary = cond.summary[:1024]
        alert.details = cond.details if cond.attempt is None else {**cond.details, "attempt": cond.attempt}
        if alert.state == "pending" and now - alert.started_at >= cond.rule.for_seconds:
            alert.state, alert.fired_at = "firing", now
            transitions.append(alert)
    for key, alert in open_alerts.items():
        if key in holding:
            continue
        rule = by_name.get(alert.rule)
        keep = rule.keep_firing_for if rule else 0.0
        if alert.state == "pending":
            alert.state, alert.resolved_at = "resolved", now  # never fired: nobody was paged
        elif now - alert.last_true_at >= keep:
            alert.state, alert.resolved_at = "resolved", now
            resolved.append(alert)
    for alert in touched:
        alert.silenced = silenced(alert, active_silences, now)
    session.flush()
    return [Transition(a.id, "firing") for a in transitions] + [
        Transition(a.id, "resolved") for a in resolved
    ]
