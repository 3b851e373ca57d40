"""How this replica shares the analysis with the others (jobs/affinity.py), as of its last pass."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge


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
