"""The periodic analysis pass: each job's window is analysed by one replica and the result stored.

Ownership is a PostgreSQL transaction-scoped advisory lock per job, taken with try-lock: a replica
that does not get it skips the job this pass, so any number of replicas can run this loop. The
embedded SQLite database has a single server process and needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from smon_server.context import ServerContext
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs import waste
from smon_server.store.models import AnalysisResult, Job

log = logging.getLogger(__name__)


async def analysis_loop(context: ServerContext, stop: asyncio.Event) -> None:
    interval = context.settings.analysis_interval
    while not stop.is_set():
        try:
            await asyncio.to_thread(analysis_pass, context, time.time())
        except Exception:
            log.exception("analysis pass failed; retrying next interval")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


def analysis_pass(context: ServerContext, now: float) -> int:
    """Analyse every job with news since its last result; returns how many were analysed."""
    with context.db.session() as session:
        jobs = session.scalars(select(Job.job_id)).all()
    done = 0
    for job_id in jobs:
        try:
            if _analyse_one(context, job_id, now):
                done += 1
        except Exception:
            log.exception("analysis of job %s failed", job_id)
    return done


def _try_lease(session: Session, job_id: str) -> bool:
    if session.get_bind().dialect.name != "postgresql":
        return True
    got = session.execute(
        text("SELECT pg_try_advisory_xact_lock(hashtextextended(:job, 0))"), {"job": job_id}
    ).scalar()
    return bool(got)


def _analyse_one(context: ServerContext, job_id: str, now: float) -> bool:
    settings = context.settings
    with context.db.transaction() as session:
        if not _try_lease(session, job_id):
            return False
        job = session.get(Job, job_id)
        if job is None:
            return False
        previous = session.get(AnalysisResult, job_id)
        if previous is not None and not job_analysis.needs_refresh(
            session=session, job=job, previous=previous, settings=settings, now=now
        ):
            return False
        result = job_analysis.analyze_job(session=session, job=job, settings=settings, now=now)
        waste.accumulate_waste(job=job, result=result)
        summary = result["summary"]
        row = previous or AnalysisResult(job_id=job_id)
        row.computed_at = now
        row.from_step = summary.get("from_step")
        row.to_step = summary.get("to_step")
        row.steps_seen = summary.get("steps_seen", 0)
        row.slowdown = summary.get("slowdown")
        row.waste_fraction = summary.get("waste_fraction")
        row.result = result
        session.add(row)
    return True
