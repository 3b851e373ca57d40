"""Server settings: one pydantic-settings class, read from `SMON_*` environment variables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"


def default_database_url() -> str:
    """The embedded SQLite file a fresh machine runs on (XDG data dir, like other CLI tools)."""
    data_home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return f"sqlite:///{data_home / 'smon' / 'smon.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SMON_", env_ignore_empty=True, extra="ignore")

    database_url: str = Field(default_factory=default_database_url)
    # How long to wait for the database before what needed it fails as "database unavailable"
    # (503 with Retry-After, ingest UNAVAILABLE, an analysis pass skipped) instead of waiting for
    # as long as a hung database hangs: a new connection (PostgreSQL: whole seconds, at least 2),
    # and each answer to a statement (SQLite: a lock another writer holds). /readyz and /metrics
    # answer probes and scrapes on their callers' deadlines (1 s, 10 s by default), so their
    # statements get `database_probe_timeout` at most. store/db.py.
    database_connect_timeout: Annotated[float, Field(gt=0)] = 5.0
    database_statement_timeout: Annotated[float, Field(gt=0)] = 30.0
    database_probe_timeout: Annotated[float, Field(gt=0)] = 2.0
    http_host: str = "0.0.0.0"
    http_port: int = 8080
    grpc_host: str = "0.0.0.0"
    grpc_port: int = 50051

    ingest_token: str | None = None
    api_token: str | None = None
    # TLS for both listeners when both files are given (PEM).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    slack_webhook_url: str | None = None
    pagerduty_routing_key: str | None = None
    pagerduty_url: str = PAGERDUTY_EVENTS_URL
    webhook_url: str | None = None
    public_url: str = "http://localhost:8080"  # SMon as on-call engineers reach it: links in alerts
    # Grafana with SMon's dashboards (deploy/grafana): the dashboard links jobs to it when set.
    grafana_url: str | None = None

    alert_rules: str | None = None  # YAML file overriding the default alert rules (alerts/rules.py)
    analysis_interval: Annotated[float, Field(gt=0)] = 10.0
    # Most recent complete steps one analysis pass looks at...
    analysis_window_steps: Annotated[int, Field(gt=0)] = 500
    # ... and at most this many rank-steps (fewer steps for the largest jobs: 500 up to 4,096
    # ranks, 128 at 16,384; never fewer than analysis_window_min_steps), so what a pass costs
    # stays bounded by operations, not by a job's size (jobs/step_ranges.window_steps).
    analysis_window_rank_steps: Annotated[int, Field(gt=0)] = 4096 * 512
    analysis_window_min_steps: Annotated[int, Field(gt=0)] = 50
    # Processes that run job analyses (jobs/workers.py); unset: every core but one; 0: in the
    # server process itself.
    analysis_workers: Annotated[int | None, Field(ge=0)] = None
    # Memory each analysing process may keep jobs' op tables in between passes, so a pass reads
    # and builds only the new steps (jobs/window_cache.py); unset: a third of the machine's
    # memory shared by the small jobs' workers, an eighth for the big jobs' worker; 0 turns it off.
    analysis_cache_mb: Annotated[int | None, Field(ge=0)] = None
    # Seconds an API request waits for the analysis of a step window the pass has not stored
    # (`?from_step=`, `?to_step=`, `?window=`; jobs/windows.py) before it is answered 504; the
    # analysis goes on and is kept, so asking again gets it.
    window_analysis_timeout: Annotated[float, Field(gt=0)] = 30.0
    stall_seconds: Annotated[float, Field(gt=0)] = 120.0
    gpu_hour_price: Annotated[float, Field(ge=0)] = 0.0
    # The first steps after a start or restart (allocator, lazy init, DDP bucket rebuild) are
    # shown but left out of S, attribution, diagnoses and GPU-hours.
    warmup_steps: Annotated[int, Field(ge=0)] = 10
    # D*: "robust" leaves workers that stand out from their peers out of the ideal (live default,
    # true on small jobs); "paper" is the published estimator (mean over every instance).
    estimator: Literal["paper", "robust"] = "robust"
    # Stragglers are also looked for in the newest steps alone: those that ended within this many
    # seconds of the newest (at least `recent_min_steps`), so a new straggler is named within
    # seconds of its onset instead of when it dominates the whole window (summary `recent`).
    recent_seconds: Annotated[float, Field(gt=0)] = 15.0
    recent_min_steps: Annotated[int, Field(ge=2)] = 5
    # ... and at most this many: with fast steps (a 4,096-rank job at 40 ms a step), the newest
    # 15 s were 375 of the 500 window steps, a second near-full engine run on every pass, and a
    # shorter stretch names an onset sooner, not later. Never more than a tenth of the job's
    # default window either (jobs/step_ranges.recent_steps_most).
    recent_max_steps: Annotated[int, Field(ge=2)] = 50
    auto_migrate: bool = True
    # Raw step records older than this many days are dropped (whole day partitions on
    # PostgreSQL); stored analyses stay. 0 keeps them forever.
    retention_days: Annotated[float, Field(ge=0)] = 14.0

    # Ingest limits: what a single batch and record may hold before it is rejected.
    max_batch_records: Annotated[int, Field(gt=0)] = 10_000
    max_message_bytes: Annotated[int, Field(gt=0)] = 32 * 1024 * 1024
    max_spans_per_step: Annotated[int, Field(gt=0)] = 4096
    max_duration_seconds: Annotated[float, Field(gt=0)] = 86_400.0
    # Group commit (ingest/commits.py): records per transaction at most, and records waiting to be
    # written before streams stop taking batches in (past half of it, Acks ask agents to throttle).
    ingest_group_records: Annotated[int, Field(gt=0)] = 50_000
    ingest_pending_records: Annotated[int, Field(gt=0)] = 200_000
    # Writer threads, each with its own connection, on PostgreSQL (SQLite: one).
    ingest_writers: Annotated[int, Field(gt=0)] = 2
    # Seconds a writer waits for more batches after the first of a group (ingest/commits.py): at
    # a fleet's many small batches a second, a group's own cost is then shared by many batches.
    ingest_linger_seconds: Annotated[float, Field(ge=0, le=1)] = 0.05
    # Records per second one agent may send before its Acks ask it to hold back (and, past twice
    # its 10 s burst, its batches are refused: ingest/limits.py). 0: no limit. A rank sends a few.
    ingest_agent_records_per_second: Annotated[float, Field(ge=0)] = 5_000.0
    # Batches a second one replica takes before its Acks ask agents to flush less often:
    # Ack.flush_seconds = open agent streams / this (at most smon.shipper.MAX_FLUSH_SECONDS), so a
    # fleet's records come in fewer, larger batches. A replica's cost is per batch, not per record
    # (docs/server.md "Fleet scale"). 0: never ask.
    ingest_batches_per_second: Annotated[float, Field(ge=0)] = 500.0
    # Seconds a stored batch's dedup ledger row is kept (store/ledger.py); past it, a resend of
    # the batch is still recognised by its agent's floor. An agent resends within minutes.
    ingest_ledger_seconds: Annotated[float, Field(gt=0)] = 3600.0
    # Distinct jobs that may report at once (heard from within the hour) per ingest token, per
    # replica; a new job past it is refused (`too_many_jobs`). 0: no limit.
    ingest_max_jobs: Annotated[int, Field(ge=0)] = 10_000
    # Distinct phase (span kind) names one job attempt may use beside the standard ones
    # (store/kinds.py); spans of later names are stored as `other` and counted in the job's
    # summary. Each name is an op type the analysis replays and a heatmap row the pass stores
    # per step (docs/storage.md "Span kind names per job").
    max_phase_names: Annotated[int, Field(ge=0, le=16_384)] = 64

    metrics_top_k: Annotated[int, Field(ge=0)] = 5
    # Hosts with `smon_host_*` series: the suspect ones first, then the most straggler jobs.
    metrics_top_hosts: Annotated[int, Field(ge=0)] = 20
    # The fleet view (docs/hosts.md): a host charged with stragglers in at least this many
    # distinct jobs within this many days is `suspect` (the `host_suspect` alert rule).
    host_suspect_jobs: Annotated[int, Field(ge=1)] = 3
    host_suspect_days: Annotated[float, Field(gt=0)] = 7.0
    # Host history (incidents, GPU events, which jobs ran where) outlives step-record retention,
    # so a host's record spans many jobs; after this many days it goes too (0: kept for good).
    # A quarter covers the suspect rule, the /hosts periods people ask for and a drain-and-return.
    host_history_days: Annotated[float, Field(ge=0)] = 90.0
    # Finished jobs' series stay this long after the job was last heard from, then go away.
    metrics_finished_grace: Annotated[float, Field(ge=0)] = 900.0

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, url: str) -> str:
        """Accept the URLs people paste (postgres://, postgresql://) and pin the psycopg 3 driver."""
        for prefix in ("postgres://", "postgresql://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url
