"""Tables: jobs, the agents reporting for them, their step records and GPU samples, and results.

Times are Unix seconds as floats on the server's clock (agent times are shifted by the agent's
reported clock offset at ingest): the analysis works on floats, and one clock is what it needs.
The schema only changes through Alembic migrations in `migrations/`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    REAL,
    BigInteger,
    Boolean,
    Double,
    Identity,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# jsonb on PostgreSQL (compact, indexable), plain JSON text on SQLite.
JsonType = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    pass


class Job(Base):
    """One attempt of a job: a run of its processes under the job id, numbered from 1. A job
    restarted under the same id (torchrun elastic restart, a resubmission) reports into a new
    attempt (store/attempts.py), so every table keyed by the job's integer `key` (step records,
    phase columns) or by (job_id, attempt) is per attempt, and runs are never mixed."""

    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False, default=1)
    # A small integer for the (job, attempt) in every step record (SQLite: assigned by
    # store/writes.py).
    key: Mapped[int] = mapped_column(Integer, Identity(), unique=True)
    # The largest attempt identity its agents reported (Coordinates.attempt: a restart count);
    # NULL when none did.
    reported_attempt: Mapped[int | None] = mapped_column(BigInteger, default=None)
    world_size: Mapped[int] = mapped_column(Integer, default=0)
    dp_size: Mapped[int] = mapped_column(Integer, default=0)
    pp_size: Mapped[int] = mapped_column(Integer, default=1)
    tp_size: Mapped[int] = mapped_column(Integer, default=1)
    first_seen: Mapped[float] = mapped_column(Double)
    last_seen: Mapped[float] = mapped_column(Double)
    last_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # Server time when the last step record arrived: "no step for SMON_STALL_SECONDS" reads this.
    last_step_seen: Mapped[float | None] = mapped_column(Double, default=None)
    # Ingest transactions that stored step records of this job attempt: a pass that read n has
    # news when there are more. (A time cannot say it: a write stamped before a pass began may
    # commit after the pass read the records.)
    step_writes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Accumulated by the analysis loop: waste × GPUs × wall time covered by new steps.
    gpu_hours_wasted: Mapped[float] = mapped_column(Double, default=0.0)
    wasted_until: Mapped[float | None] = mapped_column(Double, default=None)
    # Spans whose phase name came past the attempt's SMON_MAX_PHASE_NAMES and were stored as
    # `other` (store/kinds.py), and the first such name: the summary's data-quality note.
    # (Database-side defaults: the ingest upsert inserts from arrays of the other columns.)
    folded_spans: Mapped[int] = mapped_column(BigInteger, server_default="0")
    folded_example: Mapped[str] = mapped_column(String(128), server_default="")


class Agent(Base):
    """One agent process (one rank's lifetime). A restarted rank is a new agent. An agent
    belongs to one attempt of its job for good: a late batch of an old run stays in it."""

    __tablename__ = "agents"
    __table_args__ = (Index("ix_agents_job_attempt_rank", "job_id", "attempt", "rank"),)

    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[int] = mapped_column(Integer, Identity(), unique=True)  # as Job.key
    job_id: Mapped[str] = mapped_column(String(256))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    rank: Mapped[int] = mapped_column(Integer)
    local_rank: Mapped[int] = mapped_column(Integer, default=0)
    host: Mapped[str] = mapped_column(String(256), default="")
    gpu_uuid: Mapped[str] = mapped_column(String(128), default="")
    dp_rank: Mapped[int] = mapped_column(Integer, default=0)
    pp_rank: Mapped[int] = mapped_column(Integer, default=0)
    tp_rank: Mapped[int] = mapped_column(Integer, default=0)
    pid: Mapped[int] = mapped_column(Integer, default=0)
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    backend: Mapped[str] = mapped_column(String(32), default="")  # torch.distributed backend
    clock_offset: Mapped[float] = mapped_column(Double, default=0.0)
    first_seen: Mapped[float] = mapped_column(Double)
    last_seen: Mapped[float] = mapped_column(Double)
    dropped_records: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)
    final: Mapped[bool] = mapped_column(Boolean, default=False)
    # The first step this incarnation reported: where the job started or restarted (warm-up).
    first_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # The latest heartbeat: where this rank stands right now.
    hb_time: Mapped[float | None] = mapped_column(Double, default=None)
    hb_last_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    hb_current_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    hb_phase: Mapped[str] = mapped_column(String(128), default="")
    hb_phase_since: Mapped[float | None] = mapped_column(Double, default=None)


class IngestedBatch(Base):
    """(agent_id, seq) of every stored batch: a resent batch is recognised and stored once."""

    __tablename__ = "ingested_batches"
    # Pruning finds the rows past SMON_INGEST_LEDGER_SECONDS by this (store/ledger.py).
    __table_args__ = (Index("ix_ingested_batches_received_at", "received_at"),)

    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(256))
    received_at: Mapped[float] = mapped_column(Double)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    # Of the batch's valid records (ValidBatch.digest): a resend must carry the same records.
    # NULL for batches stored before migration 0007.
    digest: Mapped[int | None] = mapped_column(BigInteger, default=None)


class IngestedFloor(Base):
    """Per agent, the highest seq whose ledger row was pruned (store/ledger.py): a batch at or
    below it was stored (or given up) long ago, so a late resend of it is a duplicate."""

    __tablename__ = "ingested_floors"

    agent_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)
    pruned_at: Mapped[float] = mapped_column(Double)


class SpanKind(Base):
    """A job attempt's span kind names (phases) as small integers: a step record stores codes, not
    repeated text. Each attempt has its own dictionary, at most SMON_MAX_PHASE_NAMES names beside
    the standard ones (store/kinds.py), so no job can fill a dictionary another job needs."""

    __tablename__ = "job_span_kinds"
    __table_args__ = (UniqueConstraint("job_key", "name", name="uq_job_span_kinds_name"),)

    job_key: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    code: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(128))


class StepRecord(Base):
    """One completed step on one rank, in about 150 bytes (docs/storage.md).

    Keyed by the job's and the agent's integer keys; the rank's coordinates (dp / pp / tp) live
    on its agent row. `spans` packs each timed operation into 14 bytes (store/codec.py: kind
    code, micro-batch, chunk, start relative to the step's start and duration as float32);
    phase totals are derived from the spans, not stored. On PostgreSQL the table is partitioned by
    `start_time` (one partition per UTC day, store/partitions.py); the key includes it, as
    partitioning requires, and a resent record has the same start, so it is still stored once.
    """

    __tablename__ = "step_records"
    __table_args__ = ({"postgresql_partition_by": "RANGE (start_time)"},)

    job_key: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_time: Mapped[float] = mapped_column(Double, primary_key=True)
    duration: Mapped[float] = mapped_column(REAL)
    agent_key: Mapped[int] = mapped_column(Integer)
    gc_count: Mapped[int] = mapped_column(SmallInteger, default=0)
    gc_seconds: Mapped[float] = mapped_column(REAL, default=0.0)
    spans: Mapped[bytes] = mapped_column(LargeBinary)
    seq_total: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    seq_microbatches: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    # Device-timed records only: each span's host view (store/codec.py SPAN_HOST).
    span_host: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)


class PhaseColumn(Base):
    """One step of one metric's rank × step heatmap (store/phase_grids.py): every rank's seconds
    as float32, so a phase heatmap reads a few hundred rows instead of decoding every record of
    the window. Written by the analysis pass from the records it reads anyway; covers its window.

    `metric` is a span kind code, or STEP_TIME / GC / OTHER (negative). `seconds` holds ranks
    0..n-1 (NaN where a rank has no value); `present` (the step_time row only) has a bit per rank
    that has a record of the step. On PostgreSQL `seconds` is stored uncompressed out of line, so
    a rank zoom reads only its bytes (`substring`)."""

    __tablename__ = "phase_columns"

    job_key: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    present: Mapped[bytes | None] = mapped_column(LargeBinary, default=None)
    seconds: Mapped[bytes] = mapped_column(LargeBinary)


class GpuSample(Base):
    __tablename__ = "gpu_samples"

    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[float] = mapped_column(Double, primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(128), default="")
    sm_clock_mhz: Mapped[float | None] = mapped_column(Double)
    sm_clock_max_mhz: Mapped[float | None] = mapped_column(Double)
    mem_clock_mhz: Mapped[float | None] = mapped_column(Double)
    mem_clock_max_mhz: Mapped[float | None] = mapped_column(Double)
    gpu_util: Mapped[float | None] = mapped_column(Double)
    mem_util: Mapped[float | None] = mapped_column(Double)
    mem_used_bytes: Mapped[float | None] = mapped_column(Double)
    mem_total_bytes: Mapped[float | None] = mapped_column(Double)
    temperature_c: Mapped[float | None] = mapped_column(Double)
    power_w: Mapped[float | None] = mapped_column(Double)
    power_limit_w: Mapped[float | None] = mapped_column(Double)
    throttle_reasons: Mapped[int | None] = mapped_column(BigInteger)
    ecc_corrected: Mapped[int | None] = mapped_column(BigInteger)
    ecc_uncorrected: Mapped[int | None] = mapped_column(BigInteger)
    pcie_replay: Mapped[int | None] = mapped_column(BigInteger)
    xid_events: Mapped[list[Any]] = mapped_column(JsonType)


class AnalysisResult(Base):
    """The latest analysis of a job attempt's recent window, stored in the shapes the API serves.

    The scalar columns are what lists, metrics and alerts read (no JSON to decode for a few
    numbers); each API view has a column of its own, loaded only when asked for (`deferred`): the
    summary, the per-step series as packed columns (store/step_series.py), the S_w grid, S_w per
    rank, and the rank × step heatmap as compact float32 bytes (store/grids.py)."""

    __tablename__ = "analysis_results"

    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False, default=1)
    computed_at: Mapped[float] = mapped_column(Double)
    # The job's step_writes as the pass read it before reading any record (None: stored before
    # the counter; computed_at decides for it).
    step_writes_seen: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # The job's state when this was computed: the state served next to these numbers.
    state: Mapped[str] = mapped_column(String(16), default="")
    from_step: Mapped[int | None] = mapped_column(BigInteger)
    to_step: Mapped[int | None] = mapped_column(BigInteger)
    steps_seen: Mapped[int] = mapped_column(Integer, default=0)
    slowdown: Mapped[float | None] = mapped_column(Double)
    waste_fraction: Mapped[float | None] = mapped_column(Double)
    window_start: Mapped[float | None] = mapped_column(Double)
    window_end: Mapped[float | None] = mapped_column(Double)
    stragglers: Mapped[int] = mapped_column(Integer, default=0)
    worst_rank: Mapped[int | None] = mapped_column(Integer)  # the first straggler's rank
    leading_cause: Mapped[str] = mapped_column(String(32), default="")
    # The replay missed the measured steps by > 5%: shown, not trusted, never paged on.
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    # The newest steps alone (summary.recent): who straggles right now, for alerts.
    recent_slowdown: Mapped[float | None] = mapped_column(Double)
    recent_stragglers: Mapped[list[Any] | None] = mapped_column(JsonType)  # [{rank, host, cause}]
    step_seconds: Mapped[float | None] = mapped_column(Double)  # mean step time of the window
    # The metrics_top_k workers by S_w: [{rank, host, gpu_uuid, slowdown}] (small: read per scrape)
    top_workers: Mapped[list[Any] | None] = mapped_column(JsonType)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JsonType, deferred=True)
    steps: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)  # store/step_series.py
    workers: Mapped[dict[str, Any] | None] = mapped_column(JsonType, deferred=True)
    rank_overall: Mapped[dict[str, Any] | None] = mapped_column(JsonType, deferred=True)
    heatmap: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    # The latest pass failed (jobs/loop.py): why, and when. The views above are the last good
    # pass's (or empty); "" when the latest pass succeeded.
    error: Mapped[str] = mapped_column(String(512), server_default="")
    error_at: Mapped[float | None] = mapped_column(Double, default=None)


class JobTrend(Base):
    """A job's history, one row per bucket of consecutive steps (jobs/trend.py): each analysed
    step's measured and ideal step time as of the last pass that saw it (float32, NaN where a step
    was not analysed), and who straggled then. Rows outlive the analysis window and the raw steps."""

    __tablename__ = "job_trend"

    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False, default=1)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # step // bucket size
    first_step: Mapped[int] = mapped_column(BigInteger)  # of the bucket's analysed steps
    last_step: Mapped[int] = mapped_column(BigInteger)
    step_times: Mapped[bytes] = mapped_column(LargeBinary)  # float32 per step of the bucket
    ideal_times: Mapped[bytes] = mapped_column(LargeBinary)
    start_time: Mapped[float | None] = mapped_column(Double)
    end_time: Mapped[float | None] = mapped_column(Double)
    stragglers: Mapped[list[Any]] = mapped_column(JsonType)  # ranks named by the passes that saw it
    leading_cause: Mapped[str] = mapped_column(String(32), default="")
    computed_at: Mapped[float] = mapped_column(Double)


class Alert(Base):
    """One incident: a rule true for a job (and a host, for per-host rules) until it resolves.

    `dedup_key` is stable per (job, rule[, host]) and open incident, so a job pages once however
    many ranks straggle, and a rule that comes back after resolving opens a new incident."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_job_state", "job_id", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dedup_key: Mapped[str] = mapped_column(String(400))
    rule: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(256))
    host: Mapped[str] = mapped_column(String(256), default="")
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))  # pending, firing, resolved
    summary: Mapped[str] = mapped_column(String(1024), default="")
    details: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    started_at: Mapped[float] = mapped_column(Double)  # condition first true
    fired_at: Mapped[float | None] = mapped_column(Double)
    last_true_at: Mapped[float] = mapped_column(Double)
    resolved_at: Mapped[float | None] = mapped_column(Double)
    acked_at: Mapped[float | None] = mapped_column(Double)
    acked_by: Mapped[str] = mapped_column(String(256), default="")
    silenced: Mapped[bool] = mapped_column(Boolean, default=False)


class Silence(Base):
    """Alerts whose labels match every matcher (fnmatch patterns on job, rule, host) stay quiet
    between `starts_at` and `ends_at`; they are still tracked and shown."""

    __tablename__ = "silences"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    matchers: Mapped[dict[str, Any]] = mapped_column(JsonType)
    starts_at: Mapped[float] = mapped_column(Double)
    ends_at: Mapped[float] = mapped_column(Double)
    created_by: Mapped[str] = mapped_column(String(256), default="")
    comment: Mapped[str] = mapped_column(String(1024), default="")


class Notification(Base):
    """The outbox: one message for one notifier about one alert transition, written in the same
    transaction as the transition and sent by a background sender (never by ingest or analysis),
    retried with backoff until it is delivered; every attempt is recorded here."""

    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_due", "sent_at", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    alert_id: Mapped[int] = mapped_column(Integer)
    notifier: Mapped[str] = mapped_column(String(32))  # slack, pagerduty, webhook
    event: Mapped[str] = mapped_column(String(16))  # firing, resolved, acknowledged
    payload: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[float] = mapped_column(Double)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Double)
    sent_at: Mapped[float | None] = mapped_column(Double)
    last_error: Mapped[str] = mapped_column(String(1024), default="")


class AlertCounter(Base):
    """The last value the alert engine saw of a job's cumulative counter, and when it last grew:
    what turns "agents dropped N records since they started" into "are dropping records now"."""

    __tablename__ = "alert_counters"

    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)
    changed_at: Mapped[float] = mapped_column(Double)


class HostJob(Base):
    """A job attempt that ran ranks on a host (hosts/record.py): the "jobs run" of the fleet view,
    kept after the job's raw steps and agents' details go. `gpu_scanned_until` is how far the
    job's NVML samples were turned into the host's GPU events."""

    __tablename__ = "host_jobs"
    __table_args__ = (Index("ix_host_jobs_last_seen", "last_seen"),)

    host: Mapped[str] = mapped_column(String(256), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ranks: Mapped[int] = mapped_column(Integer, default=0)
    gpus: Mapped[list[Any]] = mapped_column(JsonType)  # GPU UUIDs its ranks reported
    first_seen: Mapped[float] = mapped_column(Double)
    last_seen: Mapped[float] = mapped_column(Double)
    gpu_scanned_until: Mapped[float | None] = mapped_column(Double, default=None)


class HostIncident(Base):
    """A rank named a straggler by a job's stored analysis, charged to the rank's own host
    (hosts/record.py says which causes count and when a job-wide slowdown counts against none).
    One row per (job attempt, rank): later passes widen its time span and keep its worst S_w."""

    __tablename__ = "host_incidents"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "rank", name="uq_host_incidents_rank"),
        Index("ix_host_incidents_host_last_seen", "host", "last_seen"),
        Index("ix_host_incidents_last_seen", "last_seen"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(256))
    job_id: Mapped[str] = mapped_column(String(256))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    gpu_uuid: Mapped[str] = mapped_column(String(128), default="")
    dp_rank: Mapped[int | None] = mapped_column(Integer, default=None)
    stage: Mapped[int | None] = mapped_column(Integer, default=None)
    cause: Mapped[str] = mapped_column(String(32))
    slowdown: Mapped[float] = mapped_column(Double)  # S_w, the worst a pass saw
    job_slowdown: Mapped[float | None] = mapped_column(Double, default=None)
    # The job's GPU-hours lost to stragglers, times this rank's share of them.
    gpu_hours_lost: Mapped[float] = mapped_column(Double, default=0.0)
    evidence: Mapped[dict[str, Any]] = mapped_column(JsonType)
    first_seen: Mapped[float] = mapped_column(Double)  # the analysed window's start
    last_seen: Mapped[float] = mapped_column(Double)  # ... and its end, over every pass
    computed_at: Mapped[float] = mapped_column(Double)


class HostGpuEvent(Base):
    """A GPU health event on a host, derived from stored NVML samples (hosts/gpu_events.py): an
    XID error (`code`), new uncorrectable ECC errors (`value` new, `total` the counter), or a
    stretch of throttling for one `reason` (`value` seconds). Kept like incidents, past retention."""

    __tablename__ = "host_gpu_events"
    __table_args__ = (
        Index("ix_host_gpu_events_host_time", "host", "time"),
        Index("ix_host_gpu_events_time", "time"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(String(256))
    gpu_uuid: Mapped[str] = mapped_column(String(128), default="")
    job_id: Mapped[str] = mapped_column(String(256))
    rank: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # xid, ecc_uncorrected, throttle
    time: Mapped[float] = mapped_column(Double)
    code: Mapped[int | None] = mapped_column(BigInteger, default=None)  # the XID
    reason: Mapped[str] = mapped_column(String(32), default="")  # the throttle reason
    value: Mapped[float] = mapped_column(Double, default=0.0)
    total: Mapped[int | None] = mapped_column(BigInteger, default=None)  # ECC counter reading


class HostSummary(Base):
    """One host's figures over the default period (hosts/fleet.py), refreshed by the analysis
    loop: what `GET /hosts`, the host metrics and the `host_suspect` rule read, so a list of
    10,000 hosts is one sorted read, not an aggregation of every incident."""

    __tablename__ = "host_summaries"
    __table_args__ = (
        Index("ix_host_summaries_order", "suspect", "straggler_jobs", "gpu_hours_lost", "host", "last_seen"),
    )

    host: Mapped[str] = mapped_column(String(256), primary_key=True)
    first_seen: Mapped[float] = mapped_column(Double)
    last_seen: Mapped[float] = mapped_column(Double)
    jobs: Mapped[int] = mapped_column(Integer, default=0)
    straggler_jobs: Mapped[int] = mapped_column(Integer, default=0)
    gpu_hours_lost: Mapped[float] = mapped_column(Double, default=0.0)
    gpu_faults: Mapped[int] = mapped_column(Integer, default=0)  # XIDs + new uncorrectable ECC
    throttle_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    last_incident: Mapped[float | None] = mapped_column(Double, default=None)
    suspect: Mapped[bool] = mapped_column(Boolean, default=False)
    suspect_jobs: Mapped[int] = mapped_column(Integer, default=0)  # distinct jobs in the rule's days
    causes: Mapped[list[Any]] = mapped_column(JsonType)  # [{cause, jobs}] most jobs first
    gpu_events: Mapped[dict[str, Any]] = mapped_column(JsonType)
    incidents_by_day: Mapped[list[Any]] = mapped_column(JsonType)  # oldest day first
    # The host's row of `GET /hosts` as JSON text (views/hosts.py), served without decoding.
    row_json: Mapped[str] = mapped_column(Text, default="")
    refreshed_at: Mapped[float] = mapped_column(Double)
