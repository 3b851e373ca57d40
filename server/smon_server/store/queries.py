"""Reads the API, the analysis loop and the metrics collector share.

A job id may have several attempts (store/attempts.py); a `Job` row is one of them. Reads given a
job id alone resolve it to its newest attempt; lists show each job's newest attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Select, and_, case, distinct, exists, func, or_, select, text, tuple_
from sqlalchemy.orm import Session, aliased

from smon_server.store.models import Agent, Alert, AnalysisResult, GpuSample, Job


def get_job(*, session: Session, job_id: str, attempt: int | None = None) -> Job | None:
    """The job's attempt `attempt`, or its newest."""
    if attempt is not None:
        return session.get(Job, (job_id, attempt))
    stmt = select(Job).where(Job.job_id == job_id).order_by(Job.attempt.desc()).limit(1)
    return session.scalars(stmt).first()


def attempt_count(*, session: Session, job_id: str) -> int:
    """How many attempts the job has (they are numbered 1..n)."""
    return int(session.scalar(select(func.max(Job.attempt)).where(Job.job_id == job_id)) or 0)


def job_attempts(*, session: Session, job_id: str) -> Sequence[Job]:
    """Every attempt of the job, newest first."""
    return session.scalars(select(Job).where(Job.job_id == job_id).order_by(Job.attempt.desc())).all()


def is_superseded(*, session: Session, job: Job) -> bool:
    """A newer attempt of the job exists: this one's run is over."""
    newer = exists().where(Job.job_id == job.job_id, Job.attempt > job.attempt)
    return bool(session.scalar(select(newer)))


def attempt_span(*, session: Session, job: Job) -> tuple[float | None, float | None]:
    """(since, until): the server times between which the job attempt ran, for the rows that
    carry no attempt (GPU samples): from its first report (none for attempt 1) to the next
    attempt's first (none for the newest)."""
    until = session.scalar(
        select(Job.first_seen).where(Job.job_id == job.job_id, Job.attempt == job.attempt + 1)
    )
    return (job.first_seen if job.attempt > 1 else None), (None if until is None else float(until))


def _is_newest_attempt() -> Any:
    newer = aliased(Job)
    return ~exists().where(newer.job_id == Job.job_id, newer.attempt > Job.attempt)


def result_parts(
    *, session: Session, job_id: str, attempt: int, parts: Sequence[str]
) -> dict[str, Any] | None:
    """Some columns of one stored result (`state`, `computed_at`, the latest pass's `error` and
    `error_at`, and the named views), or None."""
    names = ("state", "computed_at", "error", "error_at", *parts)
    columns = [getattr(AnalysisResult, name) for name in names]
    stmt = select(*columns).where(AnalysisResult.job_id == job_id, AnalysisResult.attempt == attempt)
    row = session.execute(stmt).first()
    return None if row is None else dict(zip(names, row, strict=True))


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
    """One page of jobs (each job's newest attempt), newest first, with their stored results'
    scalar columns and their live state, filtered and counted in the database. The state is
    jobs.liveness.job_state in SQL (tests/store check that they agree). Without a state filter the
    page is cut first and only its jobs' agents are aggregated, so the default list does not read
    every agent of every job."""
    filters = [_is_newest_attempt()]
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
    results = (AnalysisResult.job_id == Job.job_id) & (AnalysisResult.attempt == Job.attempt)

    on_page = None
    if state is None:
        page = select(Job.job_id).outerjoin(AnalysisResult, results).where(*filters)
        page = page.order_by(*newest_first).limit(limit).offset(offset)
        on_page = Agent.job_id.in_(page.scalar_subquery())
    facts = _liveness_facts_stmt(on_page, newest_attempts=True).subquery()
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
        .outerjoin(facts, (facts.c.job_id == Job.job_id) & (facts.c.attempt == Job.attempt))
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


def silent_ranks(*, session: Session, job: Job, before: float) -> list[tuple[int, str]]:
    """(rank, host) of the job attempt's newest agents that did not say goodbye and were last
    heard from before `before`."""
    stmt = (
        select(Agent.rank, Agent.host)
        .where(*_of_attempt(job), _is_newest(), Agent.final.is_(False), Agent.last_seen < before)
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
        for a in session.scalars(
            select(Agent).where(Agent.job_id.in_([j for j, _ in seen])).order_by(Agent.first_seen)
        )
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
    """Records each job's agents dropped before sending, summed over every agent incarnation of
    every attempt (a counter: it never goes down when a job restarts)."""
    if not job_ids:
        return {}
    stmt = (
        select(Agent.job_id, func.sum(Agent.dropped_records))
        .where(Agent.job_id.in_(job_ids))
        .group_by(Agent.job_id)
    )
    return {job: int(n or 0) for job, n in session.execute(stmt)}


def gpu_hours_wasted(*, session: Session, job_ids: Sequence[str]) -> dict[str, float]:
    """GPU-hours each job wasted over all its attempts (a counter: it never goes down when a job
    restarts)."""
    if not job_ids:
        return {}
    stmt = (
        select(Job.job_id, func.sum(Job.gpu_hours_wasted)).where(Job.job_id.in_(job_ids)).group_by(Job.job_id)
    )
    return {job: float(h or 0.0) for job, h in session.execute(stmt)}


def _of_attempt(job: Job) -> tuple[Any, Any]:
    """Filter: the agent reports for this job attempt."""
    return Agent.job_id == job.job_id, Agent.attempt == job.attempt


def _is_newest() -> Any:
    """The agent is its rank's newest incarnation in its attempt (a restarted rank reports under
    a new agent)."""
    newer = aliased(Agent)
    return ~exists().where(
        newer.job_id == Agent.job_id,
        newer.attempt == Agent.attempt,
        newer.rank == Agent.rank,
        newer.first_seen > Agent.first_seen,
    )


def _liveness_facts_stmt(
    agents: Any = None, *, newest_attempts: bool = False
) -> Select[str, int, Any, float, Any]:
    """Per job attempt (of the agents `agents`, a filter on Agent, selects; with
    `newest_attempts`, of each job's newest attempt only), over the newest agent of each rank: all
    said goodbye, last heard from, and the quietest still-open agent. The newest incarnation is
    found with a window over (job, attempt, rank), not a NOT EXISTS per agent: a page holding a
    4,096-rank job probed the index once per agent (60 ms of a 70 ms /jobs)."""
    newest = func.max(Agent.first_seen).over(partition_by=(Agent.job_id, Agent.attempt, Agent.rank))
    inner = select(
        Agent.job_id, Agent.attempt, Agent.final, Agent.last_seen, Agent.first_seen, newest.label("newest")
    )
    if agents is not None:
        inner = inner.where(agents)
    if newest_attempts:
        # One hash join with each job's newest attempt, not a probe of `jobs` per agent.
        newest_of = select(Job.job_id, func.max(Job.attempt).label("attempt")).group_by(Job.job_id).subquery()
        inner = inner.join(
            newest_of, (newest_of.c.job_id == Agent.job_id) & (newest_of.c.attempt == Agent.attempt)
        )
    a = inner.subquery()
    return (
        select(
            a.c.job_id.label("job_id"),
            a.c.attempt.label("attempt"),
            func.min(case((a.c.final, 1), else_=0)).label("all_final"),
            func.max(a.c.last_seen).label("heard"),
            func.min(case((a.c.final, None), else_=a.c.last_seen)).label("quietest"),
        )
        .where(a.c.first_seen == a.c.newest)
        .group_by(a.c.job_id, a.c.attempt)
    )


def liveness_facts(*, session: Session, job: Job) -> tuple[bool, float | None]:
    """Over the newest agent of each rank of the job attempt: (all said goodbye, last heard from)."""
    stmt = _liveness_facts_stmt(and_(*_of_attempt(job)))
    for _, _, all_final, heard, _ in session.execute(stmt):
        return bool(all_final), float(heard)
    return False, None


def liveness_facts_of(
    *, session: Session, jobs: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], tuple[bool, float]]:
    """liveness_facts of many job attempts in one query (the analysis pass asks it of every job
    that has no new steps, to find the few whose state changed); an attempt without agents is
    absent."""
    if not jobs:
        return {}
    stmt = _liveness_facts_stmt(tuple_(Agent.job_id, Agent.attempt).in_(list(jobs)))
    return {
        (str(j), int(a)): (bool(all_final), float(heard))
        for j, a, all_final, heard, _ in session.execute(stmt)
    }


def newest_attempts(*, session: Session, job_ids: Sequence[str]) -> dict[str, int]:
    """Each job's newest attempt number (is_superseded of many attempts in one query)."""
    if not job_ids:
        return {}
    stmt = (
        select(Job.job_id, func.max(Job.attempt))
        .where(Job.job_id.in_(sorted(set(job_ids))))
        .group_by(Job.job_id)
    )
    return {str(j): int(a) for j, a in session.execute(stmt)}


def job_agents(*, session: Session, job: Job) -> list[Agent]:
    """The newest agent of each rank of the job attempt (a restarted rank reports under a new
    agent id), as ORM objects: the API shows every field of one job's agents. A pass reads
    `rank_agents` (plain rows) under the same rule."""
    agents = session.scalars(select(Agent).where(*_of_attempt(job)).order_by(*_NEWEST_LAST))
    return list({a.rank: a for a in agents}.values())


def reporting_ranks(*, session: Session, job: Job) -> int:
    """How many ranks of the job attempt reported (an agent each, restarts counted once): what
    its window's size is bounded by (jobs/step_ranges.window_steps), as a pass counts them."""
    return int(session.scalar(select(func.count(distinct(Agent.rank))).where(*_of_attempt(job))) or 0)


class RankAgent(NamedTuple):
    """What a pass needs of a rank's newest agent, as a plain row: a pass reads every agent of
    every job it analyses, and 16,384 ORM agents were ~0.4 s of it (the host rollups read them
    too, in the server's process, under the GIL ingest needs)."""

    key: int
    rank: int
    host: str
    gpu_uuid: str
    dp_rank: int
    pp_rank: int
    backend: str
    first_seen: float
    last_seen: float
    final: bool
    hb_current_step: int | None
    hb_phase: str


# A rank's agents in the order they came: the last of each rank is its newest (job_agents,
# agents_and_restarts).
_NEWEST_LAST = (Agent.rank, Agent.first_seen)

_RANK_AGENT = (
    Agent.key,
    Agent.rank,
    Agent.host,
    Agent.gpu_uuid,
    Agent.dp_rank,
    Agent.pp_rank,
    Agent.backend,
    Agent.first_seen,
    Agent.last_seen,
    Agent.final,
    Agent.hb_current_step,
    Agent.hb_phase,
)


def rank_agents(*, session: Session, job: Job) -> list[RankAgent]:
    """job_agents as plain rows, ordered by rank."""
    return agents_and_restarts(session=session, job=job)[0]


def agents_and_restarts(*, session: Session, job: Job) -> tuple[list[RankAgent], list[int]]:
    """rank_agents and restart_steps from one read of the attempt's agents (a pass needs both)."""
    rows = session.execute(
        select(*_RANK_AGENT, Agent.first_step).where(*_of_attempt(job)).order_by(*_NEWEST_LAST)
    ).all()
    latest: dict[int, RankAgent] = {}
    restarts: set[int] = set()
    for row in rows:
        k, r, host, gpu, dp, pp, backend, first, last, final, hb_step, hb_phase, first_step = row
        latest[int(r)] = RankAgent(
            int(k), int(r), host or "", gpu or "", int(dp), int(pp), backend or "", float(first),
            float(last), bool(final), None if hb_step is None else int(hb_step), hb_phase or "",
        )  # fmt: skip
        if first_step is not None:
            restarts.add(int(first_step))
    return list(latest.values()), sorted(restarts)


def later_attempt(*, session: Session, job: Job) -> tuple[bool, float | None]:
    """is_superseded and attempt_span's `until` in one query: (a newer attempt exists, the
    next attempt's first report)."""
    row = session.execute(
        select(Job.attempt, Job.first_seen)
        .where(Job.job_id == job.job_id, Job.attempt > job.attempt)
        .order_by(Job.attempt)
        .limit(1)
    ).first()
    if row is None:
        return False, None
    attempt, first_seen = row
    return True, (float(first_seen) if attempt == job.attempt + 1 and first_seen is not None else None)


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
    """The integer key of the job's newest attempt."""
    job = get_job(session=session, job_id=job_id)
    return None if job is None else int(job.key)


def resolve_window(
    *, session: Session, job: Job, window: StepWindow, default_last: int
) -> tuple[int | None, int | None]:
    """Step bounds of `window` in the job attempt: a range as given, else the newest `last` (or
    `default_last`)."""
    if window.from_step is not None or window.to_step is not None:
        return window.from_step, window.to_step
    lo, hi, _ = newest_window(session=session, job=job, last=window.last or default_last)
    return lo, hi


def newest_window(
    *, session: Session, job: Job, last: int, known: tuple[int, int] | None = None
) -> tuple[int | None, int | None, bool]:
    """The bounds of the job attempt's newest `last` distinct steps, and whether every step number
    between them has records (the window is contiguous).

    `known`, a contiguous window this returned before, spares the hop over its steps: only the
    steps after it are looked for. That is exact: a record can add a distinct step inside a range
    only where a step number had none, and a contiguous range has no such number."""
    if known is not None:
        newer = newest_steps(session=session, job=job, limit=last, lo=known[1] + 1)
        if len(newer) >= last:
            return newer[-1], newer[0], newer[0] - newer[-1] + 1 == len(newer)
        lo = max(known[0], known[1] - (last - len(newer)) + 1)
        if known[1] - lo + 1 + len(newer) == last:  # else the known window has too few: hop
            hi = newer[0] if newer else known[1]
            return lo, hi, hi - known[1] == len(newer)
    found = newest_steps(session=session, job=job, limit=last)
    if not found:
        return None, None, False
    return found[-1], found[0], found[0] - found[-1] + 1 == len(found)


def newest_steps(
    *, session: Session, job: Job, limit: int | None = None, lo: int | None = None, hi: int | None = None
) -> list[int]:
    """The job attempt's distinct steps in [lo, hi] (either bound open when None), newest first,
    at most `limit` of them.

    Steps need not be contiguous (resumed jobs, scripts that number steps by samples): they are
    found by hopping down the (job_key, step, ...) key one distinct step at a time, not by
    reading every rank's record of every step, nor by counting through the range of numbers."""
    params = {"k": job.key, "lo": -(2**63) if lo is None else lo, "hi": 2**63 - 1 if hi is None else hi}
    found = session.execute(
        text(
            "WITH RECURSIVE s(step) AS ("
            " SELECT max(step) FROM step_records WHERE job_key = :k AND step <= :hi"
            " UNION ALL"
            " SELECT (SELECT max(r.step) FROM step_records r WHERE r.job_key = :k AND r.step < s.step)"
            " FROM s WHERE s.step IS NOT NULL AND s.step > :lo"
            ") SELECT step FROM s WHERE step IS NOT NULL AND step >= :lo"
            + (" LIMIT :n" if limit is not None else "")
        ),
        params if limit is None else {**params, "n": limit},
    )
    return [int(step) for step in found.scalars()]


def restart_steps(*, session: Session, job: Job) -> list[int]:
    """The first step each agent incarnation of the job attempt reported: where it started or a
    rank restarted."""
    stmt = select(Agent.first_step).where(*_of_attempt(job), Agent.first_step.is_not(None))
    return sorted({int(s) for s in session.scalars(stmt) if s is not None})


def gpu_samples(
    *,
    session: Session,
    job_id: str,
    rank: int | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 10_000,
) -> Sequence[GpuSample]:
    """GPU samples of the job's ranks in [since, until]. Samples carry no attempt: an attempt's
    are those within its time (attempts of a job do not run at once)."""
    stmt = select(GpuSample).where(GpuSample.job_id == job_id)
    if rank is not None:
        stmt = stmt.where(GpuSample.rank == rank)
    if since is not None:
        stmt = stmt.where(GpuSample.time >= since)
    if until is not None:
        stmt = stmt.where(GpuSample.time <= until)
    return session.scalars(stmt.order_by(GpuSample.time.desc()).limit(limit)).all()
