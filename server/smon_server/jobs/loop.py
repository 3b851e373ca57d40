"""The periodic analysis pass: each job's window is analysed by one replica and the result stored.

Ownership is a PostgreSQL transaction-scoped advisory lock per job, taken with try-lock: a replica
that does not get it skips the job this pass, so any number of replicas can run this loop. The
embedded SQLite database has a single server process and needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.alerts import engine as alert_engine
from smon_server.alerts import outbox
from smon_server.alerts.notifiers import Notifier
from smon_server.alerts.rules import Rule
from smon_server.hosts import fleet
from smon_server.hosts import record as host_record
from smon_server.jobs import affinity, failures, refresh, stored_result, trend, waste
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs.workers import AnalysisWorkers, is_big
from smon_server.metrics.analysis_stats import AnalysisStats
from smon_server.settings import Settings
from smon_server.store import attempts, ledger, partitions, phase_grids, queries, toast
from smon_server.store.db import DATABASE_UNAVAILABLE, Database
from smon_server.store.leases import try_lease
from smon_server.store.models import Alert, AnalysisResult, Job
from smon_server.store.queries import RankAgent
from smon_server.store.replicas import Membership

log = logging.getLogger(__name__)


class LoopContext(Protocol):
    """What the loop needs of the server process it runs in (context.py's ServerContext is one):
    the composition root hands it in, the loop does not import the root."""

    settings: Settings
    db: Database
    workers: AnalysisWorkers | None
    alert_rules: tuple[Rule, ...]
    notifiers: list[Notifier]
    # The loop's own bookkeeping, kept by the process: when it last maintained storage, and the
    # hosts its analyses touched since it last refreshed host figures (refresh_hosts).
    storage_maintained_at: float
    hosts_touched: set[str]
    hosts_lock: threading.Lock
    hosts_refreshed_at: float
    # This replica among those sharing the database, and the figures of its share.
    membership: Membership
    analysis_stats: AnalysisStats
    # Set once the loop's first pass has ended, however it ended (runtime.BackgroundServer waits
    # for it: a test that runs passes itself must not race the loop's first one for a lease).
    first_pass_done: threading.Event

    def ingest_load(self) -> float:
        """The ingest's load, 0 to 1: the spare analysis worker is taken only while it is low."""
        ...


async def analysis_loop(context: LoopContext, stop: asyncio.Event, wake: asyncio.Event | None = None) -> None:
    """A pass every interval, and at once when `wake` is set (an agent sent its final batch: a
    finished job must not be served with the analysis of a running one)."""
    interval = context.settings.analysis_interval
    wake = wake or asyncio.Event()
    while not stop.is_set():
        wake.clear()
        started = time.monotonic()
        try:
            await asyncio.to_thread(analysis_pass, context, time.time())
        except DATABASE_UNAVAILABLE as exc:  # logged once per outage (store/availability.py)
            context.db.availability.failed(exc, "analysis passes skipped")
        except Exception:
            log.exception("analysis pass failed; retrying next interval")
        else:
            context.analysis_stats.pass_seconds.observe(time.monotonic() - started)
        finally:
            context.first_pass_done.set()
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(
                waiters,
                timeout=pause_after(interval, time.monotonic() - started),
                return_when=asyncio.FIRST_COMPLETED,
            )
        for waiter in waiters:
            waiter.cancel()


def analysis_lag(with_news: list[tuple[Job, AnalysisResult | None]], now: float) -> float:
    """How old the stalest stored analysis among the jobs with news is: since it was computed, or
    since the job was first seen when it has none. A replica that keeps up holds it near the
    interval plus a pass; one past its size lets it grow (rules.yml: SMonAnalysisBehind)."""
    ages = [now - (result.computed_at if result is not None else job.first_seen) for job, result in with_news]
    return max(ages, default=0.0)


def pause_after(interval: float, took: float) -> float:
    """The wait before the next pass: passes start an interval apart, so a job is refreshed every
    interval (a pass of 6 s then a full 10 s wait refreshed it every 16 s); a pass longer than
    the interval is followed by the next at once (only jobs with news are analysed again)."""
    return max(0.0, interval - took)


def analysis_pass(context: LoopContext, now: float) -> int:
    """Analyse every job with news since its last result, then evaluate the alert rules over the
    stored results; returns how many jobs were analysed."""
    if now - context.storage_maintained_at >= STORAGE_MAINTENANCE_SECONDS:
        try:
            maintain_storage(context, now)
            context.storage_maintained_at = now
        except DATABASE_UNAVAILABLE as exc:
            context.db.availability.failed(exc)
        except Exception:
            log.exception("step record partitions / retention failed; retrying next pass")
    with context.db.session() as session:
        # Each job attempt with its stored result's scalar columns (the views are deferred): what
        # the shares and the news below are decided on, read once.
        stored = {
            (job.job_id, job.attempt): (job, result)
            for job, result in session.execute(
                select(Job, AnalysisResult).outerjoin(
                    AnalysisResult,
                    (AnalysisResult.job_id == Job.job_id) & (AnalysisResult.attempt == Job.attempt),
                )
            )
        }
        listed = [affinity.Listed.of(job, result) for job, result in stored.values()]
        replicas = context.membership.live()
        shared = affinity.share(
            listed, context.membership.key, replicas, now, context.settings.analysis_interval
        )
        stats = context.analysis_stats
        stats.replicas.set(len(replicas))
        stats.jobs_assigned.set(shared.assigned)
        stats.jobs_taken_over.set(shared.taken_over)
        if shared.taken_over:
            log.warning("analysing %d jobs of other replicas whose analyses are overdue", shared.taken_over)
        # Smallest first: a 4,096-rank job's pass (seconds) does not hold up the refresh of the
        # small jobs queued behind it on the same worker.
        ordered = sorted(shared.mine, key=lambda j: j.world_size)
        mine = [(j.job_id, j.attempt) for j in ordered]
        big = {(j.job_id, j.attempt) for j in ordered if is_big(j.world_size)}
        # Only the jobs with news (new steps, a changed state) are leased and analysed, found for
        # all of them at once: a job with nothing new costs no lease, no transaction, no worker call.
        jobs = refresh.with_news(
            session=session, listed=[stored[key] for key in mine], settings=context.settings, now=now
        )
    big &= set(jobs)
    context.db.availability.succeeded()
    stats.interval_seconds.set(context.settings.analysis_interval)
    stats.lag_seconds.set(analysis_lag([stored[key] for key in jobs], now))

    def one(job: tuple[str, int]) -> bool:
        job_id, attempt = job
        try:
            return analyse_one(context, job_id, now, attempt=attempt)
        except DATABASE_UNAVAILABLE as exc:
            context.db.availability.failed(exc, "job analyses skipped")
            return False
        except Exception:
            log.exception("analysis of job %s (attempt %d) failed", job_id, attempt)
            return False

    workers = context.workers
    if workers is not None:
        workers.forget(set(mine))
    lanes = 0 if workers is None else 2 * workers.active + (1 if big and len(big) < len(jobs) else 0)
    if workers is not None and lanes > 1 and len(jobs) > 1:
        # Two threads per worker process, each holding its job's lease while a process analyses
        # it: one stores a finished job's result while the process analyses the next (stored
        # one after the other, a small job's pass was the sum of both, the process idle while
        # the result was written); the big jobs (a worker of their own) on a thread of their
        # own, started first, beside the small ones.
        with ThreadPoolExecutor(lanes, thread_name_prefix="smon-analysis") as pool:
            big_lane = pool.submit(lambda: sum(one(job) for job in jobs if job in big)) if big else None
            small = [job for job in jobs if job not in big] if big_lane is not None else jobs
            done = sum(pool.map(one, small)) + (big_lane.result() if big_lane is not None else 0)
    else:
        done = sum(one(job) for job in jobs)
    if workers is not None:
        # A spare worker taken while passes near the interval and ingest leaves its core idle,
        # given back once they keep up or ingest needs it; jobs moved to even the workers out
        # (jobs/worker_shares.py).
        # A gap between taking and keeping: a load near one threshold does not swing it.
        limit = SPARE_INGEST_KEEP if workers.spare_taken else SPARE_INGEST_LOAD
        workers.adapt(context.settings.analysis_interval, spare_ok=context.ingest_load() <= limit)
        stats.workers.set(workers.active)
    try:
        refresh_hosts(context, now)
    except DATABASE_UNAVAILABLE as exc:
        context.db.availability.failed(exc, "host refreshes skipped")
    except Exception:
        log.exception("host refresh failed; retrying next pass")
    try:
        settings = context.settings
        with context.db.transaction() as session:
            transitions = alert_engine.evaluate(
                session,
                now=now,
                rules=context.alert_rules,
                stall_seconds=settings.stall_seconds,
                horizon=max(settings.metrics_finished_grace, settings.stall_seconds),
                host_policy=fleet.Policy.of(settings),
            )
            for t in transitions or []:
                alert = session.get(Alert, t.alert_id)
                if alert is not None:
                    outbox.enqueue(
                        session, alert, t.kind, context.notifiers, public_url=settings.public_url, now=now
                    )
    except DATABASE_UNAVAILABLE as exc:
        context.db.availability.failed(exc, "alert evaluations skipped")
    except Exception:
        log.exception("alert evaluation failed; retrying next pass")
    return done


# The ingest load (IngestService.load) up to which the analysis may take its spare worker, and
# keep it. With 4,000 agents (load 1) and the spare taken, send->Ack p99 was 3.5 s against 0.8 s
# without it (docs/storage.md); at half the batch budget ingest uses about half a core here.
# Unlimited ingest (SMON_INGEST_BATCHES_PER_SECOND=0) reports no load: the spare is never held back.
SPARE_INGEST_LOAD = 0.5
SPARE_INGEST_KEEP = 0.7

STORAGE_MAINTENANCE_SECONDS = 3600.0
STORAGE_LEASE = "smon/storage-maintenance"


def maintain_storage(context: LoopContext, now: float) -> None:
    """Day partitions made two days ahead and step records past SMON_RETENTION_DAYS removed, by
    one replica at a time. Stored analyses are kept: a finished job's summary and trend outlive
    its raw steps (the loop does not re-analyse a job without new steps)."""
    settings = context.settings
    with context.db.transaction() as session:
        if not try_lease(session, STORAGE_LEASE):
            return
        if context.db.is_postgres:
            created = partitions.ensure_partitions(session, now=now, days_ahead=2)
            if created:
                log.info("created step record partitions %s", ", ".join(created))
        retention = settings.retention_days * 86400.0
        pruned = ledger.prune(
            session, now=now, keep_seconds=settings.ingest_ledger_seconds, floor_seconds=retention or None
        )
        if pruned:
            log.info("pruned %d dedup ledger rows older than %g s", pruned, settings.ingest_ledger_seconds)
        if settings.host_history_days > 0:
            expired = fleet.expire(session, before=now - settings.host_history_days * 86400.0)
            if expired:
                log.info(
                    "host history older than %g days: %d rows deleted", settings.host_history_days, expired
                )
        if settings.retention_days > 0:
            removed = partitions.drop_expired(
                session, now=now, retention_days=settings.retention_days, postgres=context.db.is_postgres
            )
            if removed:
                log.info(
                    "retention (%g days) removed %d step record partitions/rows",
                    settings.retention_days,
                    removed,
                )
            # Phase heatmaps of jobs whose raw steps are gone too (their slowdown heatmap, summary
            # and trend stay, like the rest of the stored analysis).
            phase_grids.drop_finished(session, seen_before=now - settings.retention_days * 86400.0)


_local_leases: dict[str, threading.Lock] = {}
_local_leases_guard = threading.Lock()


def _local_lease(name: str) -> threading.Lock:
    """Serialises passes on one job attempt within this process (a pass a test runs beside the
    loop's; SQLite has no advisory locks; on PostgreSQL the database lease also covers other
    replicas). API requests take no lease: they only read (docs/server.md)."""
    with _local_leases_guard:
        return _local_leases.setdefault(name, threading.Lock())


def analyse_one(
    context: LoopContext,
    job_id: str,
    now: float,
    *,
    attempt: int | None = None,
) -> bool:
    """Analyse one job attempt (default: the job's newest) if it has news (new steps, a changed
    state) and store the result. Each attempt has its own lease and result."""
    if attempt is None:
        with context.db.session() as session:
            attempt = queries.attempt_count(session=session, job_id=job_id)
        if not attempt:
            return False
    lease = attempts.name(job_id, attempt)
    with _local_lease(lease):
        try:
            return _analyse_leased(context, job_id, attempt, lease, now)
        except DATABASE_UNAVAILABLE:
            raise  # an outage, not this job's fault: every job waits for the database alike
        except Exception as exc:
            # This job's data broke its analysis (or the worker analysing it died): the job is
            # marked failed, with why, and every other job goes on (docs/server.md "Failed
            # analyses").
            return failures.record(
                context.db,
                job_id,
                attempt,
                lease=lease,
                now=now,
                error=exc,
                stall_seconds=context.settings.stall_seconds,
            )


def _analyse_leased(context: LoopContext, job_id: str, attempt: int, lease: str, now: float) -> bool:
    settings = context.settings
    with context.db.transaction() as session:
        if not try_lease(session, lease):  # another replica analyses it this pass
            return False
        job = session.get(Job, (job_id, attempt))
        if job is None:
            return False
        previous = session.get(AnalysisResult, (job_id, attempt))
        if previous is not None and not refresh.needs_refresh(
            session=session,
            job=job,
            previous=previous,
            settings=settings,
            now=now,
        ):
            return False
        if context.workers is not None:
            analysed = context.workers.analyze(job_id, attempt, now, big=is_big(job.world_size))
            if analysed is None:
                return False
            result = analysed
        else:
            result = job_analysis.analyze_job(session=session, job=job, settings=settings, now=now)
        if previous is not None and previous.steps_seen and not result["summary"].get("steps_seen"):
            # The raw steps are gone (retention): the stored analysis stays, with the new state.
            stored_result.restate_result(previous, result)
            failures.recovered(previous, job_id, attempt)
            return True
        waste.accumulate_waste(job=job, result=result)
        toast.prefer_lz4(session)  # the result's large values, rewritten every pass
        row = previous or AnalysisResult(job_id=job_id, attempt=attempt)
        failures.recovered(row, job_id, attempt)
        stored_result.store_result(row, result)
        session.add(row)
        if result.get("phase_columns") is not None:
            phase_grids.write(session, job.key, result["phase_columns"])
        trend.store(session, row, result.get("trend") or [], now)
        _charge_hosts(context, session, job, row, now, result.get("agents"))
    return True


def _charge_hosts(
    context: LoopContext,
    session: Session,
    job: Job,
    row: AnalysisResult,
    now: float,
    agents: Sequence[RankAgent] | None,
) -> None:
    """The fleet view's rollups of the job's new analysis and GPU samples (hosts/record.py), in
    a savepoint on PostgreSQL: a failure there is logged and leaves the job's own result standing
    (pysqlite's savepoints are unreliable: on SQLite a failure fails the job's pass, as any other).
    `agents`: those the analysis read, if it says."""
    try:
        with session.begin_nested() if context.db.is_postgres else contextlib.nullcontext():
            touched = host_record.record(session, job=job, result=row, now=now, agents=agents)
    except DATABASE_UNAVAILABLE:
        raise
    except Exception:
        log.exception("host rollups of job %s (attempt %d) failed", job.job_id, job.attempt)
        return
    with context.hosts_lock:
        context.hosts_touched |= touched


HOSTS_LEASE = "smon/hosts-refresh"


def refresh_hosts(context: LoopContext, now: float) -> None:
    """The stored host figures of the hosts this process's passes touched, and of every host
    every few minutes (incidents age out), by one replica at a time; hosts another replica's
    refresh would have taken wait for the next pass."""
    with context.hosts_lock:
        touched, context.hosts_touched = context.hosts_touched, set()
    full = now - context.hosts_refreshed_at >= fleet.FULL_REFRESH_SECONDS
    if not touched and not full:
        return
    try:
        with context.db.transaction() as session:
            if not try_lease(session, HOSTS_LEASE):
                with context.hosts_lock:
                    context.hosts_touched |= touched
                return
            policy = fleet.Policy.of(context.settings)
            fleet.refresh(session, now=now, policy=policy, hosts=None if full else touched)
        if full:
            context.hosts_refreshed_at = now
    except Exception:
        with context.hosts_lock:
            context.hosts_touched |= touched
        raise
