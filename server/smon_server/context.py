"""What one server process shares between its gRPC ingest, HTTP API and analysis loop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from smon_server.alerts.notifiers import Notifier, configured
from smon_server.alerts.rules import Rule, load_rules
from smon_server.jobs.processes import default_processes, spare_processes
from smon_server.jobs.windows import WindowAnalyses
from smon_server.jobs.workers import AnalysisWorkers
from smon_server.metrics.analysis_stats import AnalysisStats
from smon_server.metrics.ingest_stats import IngestStats
from smon_server.metrics.jobs_collector import JobsCollector
from smon_server.settings import Settings
from smon_server.store.db import Database
from smon_server.store.replicas import Membership
from smon_server.whatif.config import WhatIfConfig


@dataclass
class ServerContext:
    settings: Settings
    db: Database
    # A registry per server (not prometheus_client's global one): tests run several servers.
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    ingest_stats: IngestStats = field(init=False)
    analysis_stats: AnalysisStats = field(init=False)
    # This replica among those sharing the database (store/replicas.py): joined at its first pass.
    membership: Membership = field(init=False)
    alert_rules: tuple[Rule, ...] = field(init=False)
    notifiers: list[Notifier] = field(init=False)
    # When this process last made step partitions ahead and applied retention (jobs/loop.py).
    storage_maintained_at: float = field(default=0.0, init=False)
    # Where job analyses run (jobs/workers.py); None: in this process.
    workers: AnalysisWorkers | None = field(default=None, init=False)
    # Hosts whose stored figures this process's analyses changed, not yet refreshed, and when
    # every host's were last refreshed (jobs/loop.py refresh_hosts).
    hosts_touched: set[str] = field(default_factory=set, init=False)
    hosts_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    hosts_refreshed_at: float = field(default=0.0, init=False)
    # Set once the analysis loop's first pass has ended (jobs/loop.py).
    first_pass_done: threading.Event = field(default_factory=threading.Event, init=False)
    # Analyses of step windows the pass has not stored, asked for through the API (jobs/windows.py).
    windows: WindowAnalyses = field(init=False)
    # The gRPC port agents reach, once bound (settings may say 0: a free one).
    grpc_port: int = field(default=0, init=False)
    # The analyses' thresholds of S (DESIGN §5): a job is straggling at `straggling_threshold`, its
    # slowdown is attributed at `attribution_threshold`. The API reports them (/api/v1/info) from
    # here, so it never reaches into the engine for them.
    straggling_threshold: float = WhatIfConfig().straggling_threshold
    attribution_threshold: float = WhatIfConfig().attribution_threshold
    # Wakes the analysis loop for a pass now, from any thread (runtime.serve binds it); unbound
    # (tests that run passes themselves), asking does nothing.
    wake_loop: Callable[[], None] | None = field(default=None, init=False)
    # The ingest's load, 0 to 1 (ingest/service.py IngestService.load; runtime.serve binds it):
    # the analysis loop takes its spare worker only while it is low. Unbound: no ingest here.
    ingest_load: Callable[[], float] = field(default_factory=lambda: _no_ingest, init=False)

    def __post_init__(self) -> None:
        self.alert_rules = load_rules(self.settings.alert_rules)  # a bad file fails at start
        self.notifiers = configured(self.settings)
        self.ingest_stats = IngestStats(self.registry)
        self.analysis_stats = AnalysisStats(self.registry)
        self.membership = Membership(self.db.engine)
        self.registry.register(JobsCollector(self.db, self.settings))
        processes = default_processes(self.settings)
        if processes:
            self.workers = AnalysisWorkers(self.settings, processes, spare_processes(self.settings))
        self.windows = WindowAnalyses(self.settings, self.db, self.workers)

    def request_pass(self) -> None:
        """Ask the analysis loop for a pass soon (a job's stored analysis is of a state it has
        left: the API serves it as stored and the pass stores the new one)."""
        if self.wake_loop is not None:
            self.wake_loop()

    def close(self) -> None:
        self.membership.leave()
        self.windows.close()
        if self.workers is not None:
            self.workers.close()
        self.db.dispose()

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerContext:
        return cls(settings=settings, db=Database.from_settings(settings))


def _no_ingest() -> float:
    return 0.0
