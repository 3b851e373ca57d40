"""A job whose analysis fails is marked so, once, and nothing else is held up.

Whatever a job's records make its analysis do (a bug they trigger, a worker process killed out of
memory), the failure is that job's alone: the pass goes on to the next job, the job's stored
result says the analysis failed and why (`analysis_results.error`, `error_at`; the summary's
`analysis_state` / `analysis_error`), its last good views stay served, and the API answers as
usual instead of a 500. The job is tried again when new steps arrive (or its state changes), not
every pass (a worker that died is tried again at the next pass once). The failure is logged once
per job and reason (with its traceback); the same failure
again is not logged again, and an analysis that works again says so once.
"""

from __future__ import annotations

import logging
import re
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from smon_server.grid import Grid
from smon_server.jobs.live import empty_summary
from smon_server.jobs.processes import WORKER_DIED, WORKER_DIED_AGAIN
from smon_server.jobs.refresh import current_state
from smon_server.series import StepSeries
from smon_server.store import grids, step_series
from smon_server.store.db import Database
from smon_server.store.leases import try_lease
from smon_server.store.models import AnalysisResult, Job

log = logging.getLogger(__name__)

MAX_REASON = 512  # analysis_results.error


def describe(error: BaseException, previous: str = "") -> str:
    """One line for people: what failed and its message."""
    if isinstance(error, BrokenProcessPool):
        return WORKER_DIED_AGAIN if previous in (WORKER_DIED, WORKER_DIED_AGAIN) else WORKER_DIED
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text[:MAX_REASON]


def _same(a: str, b: str) -> bool:
    """The same failure again: numbers in messages (sizes, steps) may differ from pass to pass."""
    return re.sub(r"\d+", "#", a) == re.sub(r"\d+", "#", b)


def record(
    db: Database,
    job_id: str,
    attempt: int,
    *,
    lease: str,
    now: float,
    error: BaseException,
    stall_seconds: float,
) -> bool:
    """Mark the job attempt's analysis failed (in a transaction of its own: the one that failed
    is undone); False when another replica holds the job or it is gone."""
    with db.transaction() as session:
        if not try_lease(session, lease):
            return False
        job = session.get(Job, (job_id, attempt))
        if job is None:
            return False
        row = session.get(AnalysisResult, (job_id, attempt))
        reason = describe(error, row.error if row is not None else "")
        again = row is not None and _same(row.error or "", reason)
        if row is None:
            row = AnalysisResult(job_id=job_id, attempt=attempt)
            fill_empty(row, job, now)
            session.add(row)
        row.state = current_state(session=session, job=job, stall_seconds=stall_seconds, now=now).value
        row.error, row.error_at = reason, now
        # Tried again after the next write (refresh.py); what arrived while it failed is in it.
        row.step_writes_seen = job.step_writes
    if again:
        log.debug("analysis of job %s (attempt %d) failed again: %s", job_id, attempt, reason)
    else:
        log.error(
            "analysis of job %s (attempt %d) failed; the job is marked failed and tried again "
            "when new steps arrive: %s",
            job_id,
            attempt,
            reason,
            exc_info=None if isinstance(error, BrokenProcessPool) else error,
        )
    return True


def recovered(row: AnalysisResult, job_id: str, attempt: int) -> None:
    """Clear a stored failure: this pass worked."""
    if row.error:
        log.info(
            "analysis of job %s (attempt %d) works again (it had failed: %s)", job_id, attempt, row.error
        )
    row.error, row.error_at = "", None


def fill_empty(row: AnalysisResult, job: Job, now: float) -> None:
    """An analysis with no numbers: what a job that never analysed successfully shows."""
    summary = empty_summary(job.job_id, job.world_size)
    row.computed_at = now
    row.steps_seen = 0
    row.stragglers = 0
    row.leading_cause = ""
    row.flagged = False
    row.summary = summary
    row.steps = step_series.pack(StepSeries.empty())
    row.workers = {"dp_ranks": [], "stages": [], "values": []}
    row.rank_overall = {}
    row.top_workers = []
    row.recent_stragglers = []
    row.heatmap = grids.pack(Grid.empty())


def failed_result(job: Job, state: str, error: BaseException) -> dict[str, Any]:
    """An analysis asked for by the API (another window) that failed: served, not stored."""
    now = time.time()
    return {
        "state": state,
        "computed_at": now,
        "error": describe(error),
        "error_at": now,
        "summary": empty_summary(job.job_id, job.world_size),
        "steps": StepSeries.empty(),
        "workers": {"dp_ranks": [], "stages": [], "values": []},
        "rank_overall": {},
        "heatmap": Grid.empty(),
    }
