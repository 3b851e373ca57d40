"""Reads the API, the analysis loop and the metrics collector share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, case, exists, func, or_, select, text
from sqlalchemy.orm import Session, aliased

from smon_server.store.models import Agent, Alert, AnalysisResult, GpuSample, Job


def list_jobs(*, session: Session, contains: str | None = None) -> Sequence[Job]:
    stmt = select(Job)
    if contains:
        stmt = stmt.where(Job.job_id.contains(contains, autoescape=True))
    return session.scalars(stmt.order_by(Job.last_seen.desc(), Job.job_id)).all()


def get_job(*, session: Session, job_id: str) -> Job | None:
    return session.get(Job, job_id)


def results_by_job(*, session: Session, job_ids: Sequence[str] | None = None) -> dict[str, AnalysisResult]:
    """Stored results with their scalar columns only (the views are deferred)."""
    stmt = select(AnalysisResult)
    if job_ids is not None:
        stmt = stmt.where(AnalysisResult.job_id.in_(job_ids))
    return {r.job_id: r for r in session.scalars(stmt)}


def result_parts(*, session: Session, job_id: str, parts: Sequence[str]) -> dict[str, Any] | None:
    """Some columns of one stored result (`state`, `computed_at` and the named views), or None."""
    columns = [getattr(AnalysisResult, name) for name in ("state", "computed_at", *parts)]
    row = session.execute(select(*columns).where(AnalysisResult.job_id == job_id)).first()
    return None if row is None else dict(zip(("state", "computed_at", *parts), row, strict=True))


@dataclass(frozen=True)
class JobListRow:
    job: Job
    result: AnalysisResult | None
    live_state: str  # running / stalled / finished, now
    quietest: float | None = None  # the oldest last-heard among ranks that did not say goodbye


def job_page(
    *,
    session: Session,
    now: float,
    stall_seconds: float,
    state: str | None = None,
    slowdown_at_least: float | None = None,
    slowdown_below: float | None = None,
    contains: str | None = None,
    job_id: str | None = None,
    seen_since: float | None = None,
    limit: int | None = 100,
    offset: int = 0,
) -> tuple[list[JobListRow], int]:
    """One page of jobs, newest first, with their stored results' scalar columns and their live
    state, filtered and counted in the database. The state is jobs.liveness.job_state in SQL
    (tests/store check that they agree). Without a state filter the page is cut first and only its
    jobs' agents are aggregated, so the default list does not read every agent of every job."""
    filters = []
    if slowdown_at_least is not None:
        filters.append(AnalysisResult.slowdown >= slowdown_at_least)
    if slowdown_below is not None:
        filters.append(or_(AnalysisResult.slowdown.is_(None), AnalysisResult.slowdown < slowdown_below))
    if contains:
        filters.append(Job.job_id.contains(contains, autoescape=True))
    if job_id is not None:
        filters.append(Job.job_id == job_id)
    if seen_since is not None:
        filters.append(Job.last_seen >= seen_since)
    newest_first = (Job.last_seen.desc(), Job.job_id)
    results = AnalysisResult.job_id == Job.job_id

    on_page = None
    if state is None:
        page = select(Job.job_id).outerjoin(AnalysisResult, results).where(*filters)
        page = page.order_by(*newest_first).limit(limit).offset(offset)
        on_page = Agent.job_id.in_(page.scalar_subquery())
    facts = _liveness_facts_stmt(on_page).subquery()
    heard = func.coalesce(facts.c.heard, Job.last_seen)
    since_step = now - func.coalesce(Job.last_step_seen, Job.first_seen)
    live = case(
        (facts.c.all_final == 1, "finished"),
        (now - heard > stall_seconds, "finished"),
        (since_step > stall_seconds, "stalled"),
        else_="running",
    ).label("live_state")
    stmt = (
        select(Job, AnalysisResult, live, facts.c.quietest)
        .outerjoin(facts, facts.c.job_id == Job.job_id)
        .outerjoin(AnalysisResult, results)
        .where(*filters)
    )
    if state is not None:
        stmt = stmt.where(live == state)
    rows = session.execute(stmt.order_by(*newest_first).limit(limit).offset(offset)).all()
    if state is None:
        counted = select(func.count()).select_from(Job).outerjoin(AnalysisResult, results).where(*filters)
    else:
        counted = select(func.count()).select_from(stmt.order_by(None).subquery())
    total = int(session.scalar(counted) or 0)
    return [
        JobListRow(
            job=r[0], result=r[1], live_state=str(r[2]), quietest=None if r[3] is None else float(r[3])
        )
        for r in rows
    ], total


def exported_jobs(
    *, session: Session, now: float, stall_seconds: float, seen_since: float
) -> list[JobListRow]:
    """Jobs heard from since `seen_since` (running and stalled ones always are: they heartbeat),
    with their live state and stored scalars: what the metrics collector exports."""
    rows, _ = job_page(
        session=session, now=now, stall_seconds=stall_seconds, seen_since=seen_since, limit=None
    )
    return rows


def silent_ranks(*, session: Session, job_id: str, before: float) -> list[tuple[int, str]]:
    """(rank, host) of the job's newest agents that did not say goodbye and were last heard from
    before `before`."""
    stmt = (
        select(Agent.rank, Agent.host)
        .where(Agent.job_id == job_id, _is_newest(), Agent.final.is_(False), Agent.last_seen < before)
        .order_by(Agent.rank)
    )
    return [(int(r), str(h)) for r, h in session.execute(stmt)]


def gpu_faults(
    *, session: Session, job_ids: Sequence[str], since: float
) -> list[tuple[str, int, str, list[int], int]]:
    """(job, rank, host, XID codes, uncorrectable ECC errors) of the GPUs that reported XID events
    or a growing uncorrectable-ECC count since `since`."""
    if not job_ids:
        return []
    stmt = (
        select(GpuSample.job_id, GpuSample.rank, GpuSample.xid_events, GpuSample.ecc_uncorrected)
        .where(GpuSample.job_id.in_(job_ids), GpuSample.time >= since)
        .order_by(GpuSample.job_id, GpuSample.rank, GpuSample.time)
    )
    seen: dict[tuple[str, int], tuple[set[int], list[int]]] = {}
    for job, rank, xids, ecc in session.execute(stmt):
        codes, counts = seen.setdefault((job, int(rank)), (set(), []))
        codes.update(int(x) for x in xids or [])
        if ecc is not None:
            counts.append(int(ecc))
    hosts = {
        (a.job_id, a.rank): a.host
        for a in session.scalars(select(Agent).where(Agent.job_id.in_([j for j, _ in seen])))
    }
    out = []
    for (job, rank), (codes, counts) in sorted(seen.items()):
        ecc_new = (counts[-1] - counts[0]) if len(counts) > 1 else 0
        if codes or ecc_new > 0:
            out.append((job, rank, hosts.get((job, rank), ""), sorted(codes), ecc_new))
    return out


def firing_alerts(*, session: Session) -> dict[tuple[str, str], int]:
    """Firing incidents by (rule, severity), silenced ones included (they are still firing)."""
    stmt = select(Alert.rule, Alert.severity, func.count()).where(Alert.state == "firing")
    return {(r, s): int(n) for r, s, n in session.execute(stmt.group_by(Alert.rule, Alert.severity))}


def dropped_records(*, session: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """Records each job's agents dropped before sending, summed over every agent incarnation."""
    if not job_ids:
        return {}
    stmt = (
        select(Agent.job_id, func.sum(Agent.dropped_records))
        .where(Agent.job_id.in_(job_ids))
        .group_by(Agent.job_id)
    )
    return {job: int(n or 0) for job, n in session.execute(stmt)}


def _is_newest() -> Any:
    """The agent is its rank's newest incarnation (a restarted rank reports under a new agent)."""
    newer = aliased(Agent)
    return ~exists().where(
        newer.job_id == Agent.job_id, newer.rank == Agent.rank, newer.first_seen > Agent.first_seen
    )


def _liveness_facts_stmt(jobs: Any = None) -> Select[str, Any, float, Any]:
    """Per job (of those `jobs`, a filter on Agent.job_id, selects), over the newest agent of each
    rank: all said goodbye, last heard from, and the quietest still-open agent. The newest
    incarnation is found with a window over (job, rank), not a NOT EXISTS per agent: a page
    holding a 4,096-rank job probed the index once per agent (60 ms of a 70 ms /jobs)."""
    newest = func.max(Agent.first_seen).over(partition_by=(Agent.job_id, Agent.rank))
    inner = select(Agent.job_id, Agent.final, Agent.last_seen, Agent.first_seen, newest.label("newest"))
    if jobs is not None:
        inner = inner.where(jobs)
    a = inner.subquery()
    return (
        select(
            a.c.job_id.label("job_id"),
            func.min(case((a.c.final, 1), else_=0)).label("all_final"),
            func.max(a.c.last_seen).label("heard"),
            func.min(case((a.c.final, None), else_=a.c.last_seen)).label("quietest"),
        )
        .where(a.c.first_seen == a.c.newest)
        .group_by(a.c.job_id)
    )


def liveness_facts(
    *, session: Session, job_ids: Sequence[str] | None = None
) -> dict[str, tuple[bool, float]]:
    """Per job, over the newest agent of each rank: (all said goodbye, last heard from)."""
    stmt = _liveness_facts_stmt(Agent.job_id.in_(job_ids) if job_ids is not None else None)
    return {job: (bool(all_final), float(heard)) for job, all_final, heard, _ in session.execute(stmt)}


def job_agents(*, session: Session, job_id: str) -> Sequence[Agent]:
    """The newest agent of each rank (a restarted rank reports under a new agent id)."""
    agents = session.scalars(
        select(Agent).where(Agent.job_id == job_id).order_by(Agent.rank, Agent.first_seen)
    ).all()
    latest: dict[int, Agent] = {}
    for agent in agents:
        latest[agent.rank] = agent
    return list(latest.values())


def agents_by_job(*, session: Session) -> dict[str, list[Agent]]:
    out: dict[str, dict[int, Agent]] = {}
    for agent in session.scalars(select(Agent).order_by(Agent.first_seen)):
        out.setdefault(agent.job_id, {})[agent.rank] = agent
    return {job: list(ranks.values()) for job, ranks in out.items()}


@dataclass(frozen=True)
class StepWindow:
    """Which steps to look at: a range, or the `last` N steps seen; all unset means the default."""

    from_step: int | None = None
    to_step: int | None = None
    last: int | None = None

    @property
    def is_default(self) -> bool:
        return self.from_step is None and self.to_step is None and self.last is None


def job_key(*, session: Session, job_id: str) -> int | None:
    key = session.scalar(select(Job.key).where(Job.job_id == job_id))
    return None if key is None else int(key)


def resolve_window(
    *, session: Session, job_id: str, window: StepWindow, default_last: int
) -> tuple[int | None, int | None]:
    """Step bounds of `window`: a range as given, else the newest `last` (or `default_last`)."""
    if window.from_step is not None or window.to_step is not None:
        return window.from_step, window.to_step
    key = job_key(session=session, job_id=job_id)
    if key is None:
        return None, None
    # Steps need not be contiguous (resumed jobs): the N-th newest distinct step, found by
    # hopping down the (job_key, step, ...) key one distinct step at a time instead of reading
    # every rank's record of every step.
    found = (
        session.execute(
            text(
                "WITH RECURSIVE s(step) AS ("
                " SELECT max(step) FROM step_records WHERE job_key = :k"
                " UNION ALL"
                " SELECT (SELECT max(r.step) FROM step_records r WHERE r.job_key = :k AND r.step < s.step)"
                " FROM s WHERE s.step IS NOT NULL"
                ") SELECT step FROM s WHERE step IS NOT NULL LIMIT :n"
            ),
            {"k": key, "n": window.last or default_last},
        )
        .scalars()
        .all()
    )
    if not found:
        return None, None
    return int(min(found)), int(max(found))


def restart_steps(*, session: Session, job_id: str) -> list[int]:
    """The first step each agent incarnation reported: where the job started or restarted."""
    stmt = select(Agent.first_step).where(Agent.job_id == job_id, Agent.first_step.is_not(None))
    return sorted({int(s) for s in session.scalars(stmt) if s is not None})


def gpu_samples(
    *,
    session: Session,
    job_id: str,
    rank: int | None = None,
    since: float | None = None,
    limit: int = 10_000,
) -> Sequence[GpuSample]:
    stmt = select(GpuSample).where(GpuSample.job_id == job_id)
    if rank is not None:
        stmt = stmt.where(GpuSample.rank == rank)
    if since is not None:
        stmt = stmt.where(GpuSample.time >= since)
    return session.scalars(stmt.order_by(GpuSample.time.desc()).limit(limit)).all()
