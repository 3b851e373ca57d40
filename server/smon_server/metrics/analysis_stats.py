"""How this replica shares the analysis with the others (jobs/affinity.py), and whether it keeps up,
as of its last pass."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram

# Seconds: a pass over idle jobs takes milliseconds, a cold pass over a 16,384-rank job about a minute.
PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class AnalysisStats:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.replicas = Gauge(
            "smon_analysis_replicas",
            "Server replicas sharing the analysis passes (live membership locks in PostgreSQL), "
            "as this replica saw them at its last pass.",
            registry=registry,
        )
        self.jobs_assigned = Gauge(
            "smon_analysis_jobs_assigned",
            "Job attempts assigned to this replica's analysis passes at its last pass.",
            registry=registry,
        )
        self.jobs_taken_over = Gauge(
            "smon_analysis_jobs_taken_over",
            "Job attempts of another replica this one analysed at its last pass because their "
            "analysis was overdue (the other replica is alive but not keeping up).",
            registry=registry,
        )
        # Whether the replica keeps up (deploy/prometheus/rules.yml SMonAnalysisBehind): a pass
        # that takes longer than the interval is followed by the next at once, so a replica past
        # its size does not fail, its results only grow stale; these say by how much.
        self.pass_seconds = Histogram(
            "smon_analysis_pass_seconds",
            "Wall time of this replica's analysis passes (every job with news analysed, alerts evaluated).",
            buckets=PASS_BUCKETS,
            registry=registry,
        )
        self.lag_seconds = Gauge(
            "smon_analysis_lag_seconds",
            "At this replica's last pass: how old the stalest stored analysis among its jobs with news "
            "was (seconds since it was computed, or since the job was first seen). About the interval "
            "plus a pass when the replica keeps up; growing when it does not.",
            registry=registry,
        )
        self.workers = Gauge(
            "smon_analysis_workers",
            "Worker processes analysing this replica's jobs below 1,024 ranks after its last pass: "
            "SMON_ANALYSIS_WORKERS, or every core but one, plus the spare (the last core) while "
            "passes near the interval.",
            registry=registry,
        )
        self.interval_seconds = Gauge(
            "smon_analysis_interval_seconds",
            "SMON_ANALYSIS_INTERVAL: the time between the starts of two analysis passes.",
            registry=registry,
        )
