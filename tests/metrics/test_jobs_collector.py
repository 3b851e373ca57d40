"""The scrape-time collector exports what the stored analyses say, per job, with bounded series."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from smon_server.metrics.jobs_collector import JobsCollector
from smon_server.settings import Settings
from smon_server.store.db import Database
from smon_server.store.models import AnalysisResult
from tests.support.factories import stored_job

TOP = [
    {"rank": 3, "host": "node-1", "gpu_uuid": "GPU-aaa", "slowdown": 1.6},
    {"rank": 0, "host": "node-0", "gpu_uuid": "GPU-bbb", "slowdown": 1.02},
]


def add(
    db: Database,
    job_id: str,
    now: float,
    *,
    seen_ago: float,
    step_ago: float,
    drops: tuple[int, ...] = (0,),
    result: bool = True,
) -> None:
    """A job whose one rank ran len(drops) times (restarts), each incarnation dropping drops[i]."""
    with db.transaction() as s:
        agents = [(0, 5000 - i, seen_ago, False, n) for i, n in enumerate(drops)]
        stored_job(s, job_id, now, seen_ago=seen_ago, step_ago=step_ago, agents=agents)
        if result:
            s.add(
                AnalysisResult(
                    job_id=job_id,
                    computed_at=now,
                    state="running",
                    steps_seen=90,
                    slowdown=1.6,
                    waste_fraction=1 - 1 / 1.6,
                    step_seconds=0.8,
                    top_workers=TOP,
                )
            )


def test_jobs_are_read_at_scrape_time(db: Database) -> None:
    now = time.time()
    add(db, "slow", now, seen_ago=1, step_ago=1, drops=(5, 7))
    add(db, "hung", now, seen_ago=1, step_ago=600)
    add(db, "new", now, seen_ago=1, step_ago=1, result=False)
    add(db, "ended-long-ago", now, seen_ago=4000, step_ago=4000)
    registry = CollectorRegistry()
    registry.register(JobsCollector(db, Settings(metrics_top_k=1), clock=lambda: now))
    value = registry.get_sample_value

    assert value("smon_job_slowdown_ratio", {"job": "slow"}) == 1.6
    assert value("smon_job_waste_ratio", {"job": "slow"}) == 1 - 1 / 1.6
    assert value("smon_job_gpu_wasted_seconds_total", {"job": "slow"}) == 2.5 * 3600
    assert value("smon_job_step_seconds", {"job": "slow"}) == 0.8
    assert value("smon_job_stalled", {"job": "slow"}) == 0.0
    assert value("smon_job_stalled", {"job": "hung"}) == 1.0
    assert value("smon_job_analysis_flagged", {"job": "slow"}) == 0.0
    assert value("smon_agent_dropped_records_total", {"job": "slow"}) == 12  # both incarnations
    worker = {"job": "slow", "rank": "3", "host": "node-1", "Hostname": "node-1", "UUID": "GPU-aaa"}
    assert value("smon_worker_slowdown_ratio", worker) == 1.6
    assert (
        value(
            "smon_worker_slowdown_ratio",
            {**worker, "rank": "0", "host": "node-0", "Hostname": "node-0", "UUID": "GPU-bbb"},
        )
        is None
    )  # top 1 only
    # A job not analysed yet has its counters but no ratio; a job gone past the grace has nothing.
    assert value("smon_job_slowdown_ratio", {"job": "new"}) is None
    assert value("smon_job_stalled", {"job": "new"}) == 0.0
    assert value("smon_job_stalled", {"job": "ended-long-ago"}) is None
    assert value("smon_job_gpu_wasted_seconds_total", {"job": "ended-long-ago"}) is None


def test_numbers_follow_the_database_without_restart(db: Database) -> None:
    now = time.time()
    add(db, "j", now, seen_ago=1, step_ago=1)
    registry = CollectorRegistry()
    registry.register(JobsCollector(db, Settings(), clock=lambda: now))
    assert registry.get_sample_value("smon_job_slowdown_ratio", {"job": "j"}) == 1.6
    with db.transaction() as s:
        row = s.get(AnalysisResult, ("j", 1))
        assert row is not None
        row.slowdown = 1.05
    assert registry.get_sample_value("smon_job_slowdown_ratio", {"job": "j"}) == 1.05


def test_host_series_are_the_top_k_hosts_suspect_first(db: Database) -> None:
    from smon_server.store.models import HostSummary

    now = time.time()
    with db.transaction() as s:
        for i, (straggled, suspect) in enumerate([(5, False), (3, True), (1, False), (0, False), (2, False)]):
            s.add(
                HostSummary(
                    host=f"node-{i}",
                    first_seen=now - 600,
                    last_seen=now,
                    jobs=10,
                    straggler_jobs=straggled,
                    suspect=suspect,
                    suspect_jobs=straggled,
                    causes=[],
                    gpu_events={},
                    incidents_by_day=[],
                    refreshed_at=now,
                )
            )
    registry = CollectorRegistry()
    registry.register(JobsCollector(db, Settings(metrics_top_hosts=2), clock=lambda: now))
    value = registry.get_sample_value
    assert value("smon_host_suspect", {"host": "node-1"}) == 1.0  # suspect: first, with 3 jobs
    assert value("smon_host_straggler_jobs", {"host": "node-1"}) == 3.0
    assert value("smon_host_straggler_jobs", {"host": "node-0"}) == 5.0
    assert value("smon_host_suspect", {"host": "node-0"}) == 0.0
    for host in ("node-2", "node-3", "node-4"):  # past K, or never straggled
        assert value("smon_host_straggler_jobs", {"host": host}) is None
