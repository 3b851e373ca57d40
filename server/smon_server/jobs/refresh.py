"""Whether a job's stored analysis is stale, and the job's state now: what the analysis loop
(jobs/loop.py) asks before it runs a pass, and what a read of a job reports as its state."""

from __future__ import annotations

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
    if previous.error == WORKER_DIED:
        return True  # killed once: perhaps for another process's memory (jobs/workers.py)
    since = max(previous.computed_at, previous.error_at or previous.computed_at)
    if job.last_step_seen is not None and job.last_step_seen > since:
        return True
    state = current_state(session=session, job=job, stall_seconds=settings.stall_seconds, now=now)
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
