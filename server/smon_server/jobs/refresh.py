"""Whether a job's stored analysis is stale, and the job's state now: what the analysis loop
(jobs/loop.py) asks before it runs a pass, and what a read of a job reports as its state."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from smon_server.jobs.liveness import JobState, job_state
from smon_server.jobs.processes import WORKER_DIED
from smon_server.settings import Settings
from smon_server.store import queries
from smon_server.store.models import AnalysisResult, Job


def needs_refresh(
    *, session: Session, job: Job, previous: AnalysisResult, settings: Settings, now: float
) -> bool:
    """New steps arrived, or the job's state changed (a stall must be diagnosed while it lasts).
    A pass that failed counts as the latest: the job is tried again once new steps arrive."""
    if _news_without_state(job, previous):
        return True
    state = current_state(session=session, job=job, stall_seconds=settings.stall_seconds, now=now)
    return _state_is_news(state, previous)


def with_news(
    *,
    session: Session,
    listed: Sequence[tuple[Job, AnalysisResult | None]],
    settings: Settings,
    now: float,
) -> list[tuple[str, int]]:
    """The job attempts of `listed` (each with its stored result, as the pass listed them; in
    their order) that needs_refresh would pass, decided for all of them in two queries more, not
    several per job: a pass leases and analyses only these, so a job with nothing new costs
    (almost) nothing. An attempt with no stored result has news. The lease holder asks
    needs_refresh again, under the lease."""
    found = {(job.job_id, job.attempt): (job, stored) for job, stored in listed}
    news: set[tuple[str, int]] = set()
    quiet: list[tuple[Job, AnalysisResult]] = []
    for key, (job, previous) in found.items():
        if previous is None or _news_without_state(job, previous):
            news.add(key)
        else:
            quiet.append((job, previous))
    facts: dict[tuple[str, int], tuple[bool, float]] = {}
    newest: dict[str, int] = {}
    for start in range(0, len(quiet), _CHUNK):
        chunk = [(job.job_id, job.attempt) for job, _ in quiet[start : start + _CHUNK]]
        facts |= queries.liveness_facts_of(session=session, jobs=chunk)
        newest |= queries.newest_attempts(session=session, job_ids=[j for j, _ in chunk])
    for job, previous in quiet:
        all_final, heard = facts.get((job.job_id, job.attempt), (False, None))
        state = job_state(
            job,
            all_final=all_final,
            last_heard=heard,
            now=now,
            stall_seconds=settings.stall_seconds,
            superseded=newest.get(job.job_id, job.attempt) > job.attempt,
        )
        if _state_is_news(state, previous):
            news.add((job.job_id, job.attempt))
    return [key for key in found if key in news]


# Job attempts per query of with_news (bound parameters stay well under the drivers' limits).
_CHUNK = 1000


def _news_without_state(job: Job, previous: AnalysisResult) -> bool:
    """News that needs no look at the agents: a worker died on the last pass, or step records
    stored since the last pass read them (new steps, or a late rank's records of old ones)."""
    if previous.error == WORKER_DIED:
        return True  # killed once: perhaps for another process's memory (jobs/workers.py)
    if previous.step_writes_seen is not None:
        return job.step_writes > previous.step_writes_seen
    since = max(previous.computed_at, previous.error_at or previous.computed_at)
    return job.last_step_seen is not None and job.last_step_seen > since


def _state_is_news(state: JobState, previous: AnalysisResult) -> bool:
    if state.value != previous.state:
        return True
    return state is JobState.STALLED and not previous.error


def current_state(*, session: Session, job: Job, stall_seconds: float, now: float) -> JobState:
    """The job attempt's state now, from two aggregates (not every agent row: this runs before
    each API read of a 4,096-rank job)."""
    all_final, heard = queries.liveness_facts(session=session, job=job)
    return job_state(
        job,
        all_final=all_final,
        last_heard=heard,
        now=now,
        stall_seconds=stall_seconds,
        superseded=queries.is_superseded(session=session, job=job),
    )
