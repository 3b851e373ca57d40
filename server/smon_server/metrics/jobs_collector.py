"""Job-level Prometheus metrics, read from the stored analyses at scrape time (DESIGN §6).

A custom collector rather than gauges set by the analysis loop: every replica serves the same
numbers (they live in the database, not in one process), a restarted server exports them at
once, and a job that ended long ago simply stops being read, so its series go away. Finished
jobs stay for `metrics_finished_grace` seconds so a dashboard sees how they ended.

Cardinality is bounded: one series per job and metric, plus `metrics_top_k` workers per job. A job
restarted under the same id (a new attempt) keeps its series: the gauges follow its newest
attempt, and the counters (GPU time wasted, dropped records) add up every attempt, so they never
go down.
Per-worker series carry DCGM exporter's join labels (`Hostname`, `UUID`) beside DESIGN's `host`.

When the database cannot be read, the scrape still succeeds: the job series are left out (no
stale numbers) and `smon_database_up` says 0, while the process's own counters (ingest records
and rejections) stay visible. A database outage is when those matter most.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.hosts.fleet import DAY, PERIOD_DAYS
from smon_server.settings import Settings
from smon_server.store import queries
from smon_server.store.db import DATABASE_UNAVAILABLE, Database
from smon_server.store.models import HostSummary

log = logging.getLogger(__name__)


class JobsCollector(Collector):
    def __init__(self, db: Database, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock

    def describe(self) -> list[Metric]:
        return []  # names depend on nothing static: don't query the database at registration

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        slowdown = GaugeMetricFamily(
            "smon_job_slowdown_ratio",
            "S: the job's step time over its ideal (what-if analysis)",
            labels=["job"],
        )
        waste = GaugeMetricFamily(
            "smon_job_waste_ratio", "Fraction of GPU time lost to stragglers: 1 - 1/S", labels=["job"]
        )
        # Base units (Prometheus' naming rule): GPU-seconds, though the API and dashboard say hours.
        wasted_seconds = CounterMetricFamily(
            "smon_job_gpu_wasted_seconds",
            "GPU-seconds lost to stragglers since the job started",
            labels=["job"],
        )
        step = GaugeMetricFamily(
            "smon_job_step_seconds", "Mean step time of the analysed window", labels=["job"]
        )
        stalled = GaugeMetricFamily(
            "smon_job_stalled", "1 while agents report but no step completes (a hang)", labels=["job"]
        )
        flagged = GaugeMetricFamily(
            "smon_job_analysis_flagged",
            "1 when the latest analysis is not trusted (replay misses the measured steps by > 5%)",
            labels=["job"],
        )
        workers = GaugeMetricFamily(
            "smon_worker_slowdown_ratio",
            "S_w of the job's top-K workers: the job's slowdown with only this worker's own durations",
            labels=["job", "rank", "host", "Hostname", "UUID"],
        )
        dropped = CounterMetricFamily(
            "smon_agent_dropped_records", "Records agents dropped before sending (queue full)", labels=["job"]
        )
        up = GaugeMetricFamily("smon_database_up", "1 when the scrape could read SMon's database")
        try:
            with self.db.session() as session:
                rows = queries.exported_jobs(
                    session=session,
                    now=now,
                    stall_seconds=self.settings.stall_seconds,
                    seen_since=now - max(self.settings.metrics_finished_grace, self.settings.stall_seconds),
                )
                job_ids = [r.job.job_id for r in rows]
                drops = queries.dropped_records(session=session, job_ids=job_ids)
                wasted = queries.gpu_hours_wasted(session=session, job_ids=job_ids)
                firing = queries.firing_alerts(session=session)
                hosts = top_hosts(session, now=now, k=self.settings.metrics_top_hosts)
        except DATABASE_UNAVAILABLE as exc:
            self.db.availability.failed(exc, "metrics scrapes without job series")
            up.add_metric([], 0.0)
            yield up
            return
        self.db.availability.succeeded()
        up.add_metric([], 1.0)
        yield up
        alerts = GaugeMetricFamily(
            "smon_alerts_firing",
            "SMon's own firing alert incidents, by rule and severity",
            labels=["rule", "severity"],
        )
        for (rule, severity), count in sorted(firing.items()):
            alerts.add_metric([rule, severity], float(count))
        for row in rows:
            job_id, result = row.job.job_id, row.result
            wasted_seconds.add_metric([job_id], 3600.0 * wasted.get(job_id, 0.0))
            stalled.add_metric([job_id], 1.0 if row.live_state == "stalled" else 0.0)
            dropped.add_metric([job_id], float(drops.get(job_id, 0)))
            if result is None:
                continue
            if result.slowdown is not None:
                slowdown.add_metric([job_id], result.slowdown)
            if result.waste_fraction is not None:
                waste.add_metric([job_id], result.waste_fraction)
            if result.step_seconds is not None:
                step.add_metric([job_id], result.step_seconds)
            flagged.add_metric([job_id], 1.0 if result.flagged else 0.0)
            for w in (result.top_workers or [])[: self.settings.metrics_top_k]:
                host, uuid = str(w.get("host", "")), str(w.get("gpu_uuid", ""))
                workers.add_metric([job_id, str(w["rank"]), host, host, uuid], float(w["slowdown"]))
        yield from (slowdown, waste, wasted_seconds, step, stalled, flagged, workers, dropped, alerts)
        yield from host_metrics(hosts)


def top_hosts(session: Session, *, now: float, k: int) -> list[HostSummary]:
    """The k hosts a fleet dashboard needs (stored figures, hosts/fleet.py): suspect ones first,
    then those that straggled in the most jobs; hosts that never straggled are left out, so the
    series stay few however large the fleet."""
    if k <= 0:
        return []
    stmt = (
        select(HostSummary)
        .where(HostSummary.last_seen >= now - PERIOD_DAYS * DAY, HostSummary.straggler_jobs > 0)
        .order_by(HostSummary.suspect.desc(), HostSummary.straggler_jobs.desc(), HostSummary.host)
        .limit(k)
    )
    return list(session.scalars(stmt))


def host_metrics(hosts: list[HostSummary]) -> Iterator[Metric]:
    jobs = GaugeMetricFamily(
        "smon_host_straggler_jobs",
        "Distinct jobs in which the host's own ranks straggled, over the last 7 days (top-K hosts)",
        labels=["host"],
    )
    suspect = GaugeMetricFamily(
        "smon_host_suspect",
        "1 when the host straggled in SMON_HOST_SUSPECT_JOBS jobs within SMON_HOST_SUSPECT_DAYS days",
        labels=["host"],
    )
    for h in hosts:
        jobs.add_metric([h.host], float(h.straggler_jobs))
        suspect.add_metric([h.host], 1.0 if h.suspect else 0.0)
    yield from (jobs, suspect)
