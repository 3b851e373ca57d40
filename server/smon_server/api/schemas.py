"""Response bodies of the REST API (DESIGN §6): these field names are a public contract."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


def utc(seconds: float) -> datetime:
    """Unix seconds (how the store keeps time) as the API's timezone-aware datetime."""
    return datetime.fromtimestamp(seconds, tz=UTC)


class JobAttemptOut(BaseModel):
    """What every job response starts with: which job, which of its attempts, of how many."""

    job_id: str
    attempt: int = Field(1, description="which attempt of the job this shows (1: its first run)")
    attempts: int = Field(1, description="how many attempts the job has (restarts under the same id)")


class JobOut(JobAttemptOut):
    state: str = Field(description="running, stalled (alive, no step ends) or finished")
    world_size: int
    last_step: int | None
    slowdown: float | None = Field(description="S: simulated step time over the ideal one")
    waste_fraction: float | None = Field(description="1 - 1/S")
    gpu_hours_wasted: float
    first_seen: datetime
    last_seen: datetime
    stragglers: int = Field(0, description="workers named stragglers by the latest analysis")
    worst_rank: int | None = Field(None, description="rank of the worst straggler")
    leading_cause: str | None = Field(None, description="cause of the leading diagnosis")
    computed_at: datetime | None = Field(None, description="when the latest analysis ran")
    analysis_error: str | None = Field(None, description="why the latest analysis failed, if it did")


class JobsOut(BaseModel):
    jobs: list[JobOut]
    total: int = Field(description="jobs matching the filters (the page holds at most `limit`)")
    limit: int
    offset: int


class Straggler(BaseModel):
    rank: int
    host: str
    dp_rank: int
    stage: int
    slowdown: float = Field(description="S_w: the job's slowdown with only this worker's own durations")
    cause: str | None = Field(description="this worker's own cause (not the job's leading one)")
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="the op type it loses time in, how much, on which steps"
    )


class Diagnosis(BaseModel):
    cause: str
    share: float = Field(description="fraction of the slowdown this cause explains")
    confidence: float
    evidence: Any
    recommendation: str


class Attribution(BaseModel):
    by_op_type: dict[str, float] = {}
    by_dp_rank: dict[str, float] = {}
    by_stage: dict[str, float] = {}


class RecentOut(BaseModel):
    from_step: int | None
    to_step: int | None
    steps_seen: int
    slowdown: float | None = Field(description="S of these steps alone")
    stragglers: list[Straggler]


class DataQualityNote(BaseModel):
    kind: str = Field(description="what was wrong with the data (e.g. phase_names_folded)")
    count: int = Field(description="how many records or spans it touched")
    message: str = Field(description="what it means, and what to do about it")


class SummaryOut(JobAttemptOut):
    state: str
    world_size: int
    steps_seen: int
    from_step: int | None = Field(description="first analysed step (after warm-up)")
    to_step: int | None
    warmup_steps: int = Field(0, description="steps after each start / restart left out of S")
    estimator: str = Field("robust", description="how the ideal durations D* were estimated")
    slowdown: float | None
    waste_fraction: float | None
    gpu_hours_wasted: float
    ideal_step_time: float | None = None
    noise_floor: float | None = Field(
        None,
        description="healthy ideal / jitter-free ideal: what ordinary jitter alone costs; S is net of it",
    )
    simulation_discrepancy: float | None
    discrepancy_flagged: bool = Field(False, description="replay misses the measured steps by > 5%")
    m_w: float | None
    m_s: float | None
    attribution: Attribution
    stragglers: list[Straggler]
    diagnoses: list[Diagnosis]
    recent: RecentOut | None = Field(
        None,
        description="the newest steps alone (SMON_RECENT_SECONDS): who straggles right now, named "
        "within seconds of an onset; null when the window is that short already",
    )
    computed_at: datetime | None
    analysis_state: Literal["ok", "failed"] = Field(
        "ok",
        description="failed: the latest analysis of this job failed (`analysis_error` says why); "
        "the numbers above are the last good analysis's, if any. Tried again when new steps arrive",
    )
    analysis_error: str | None = Field(None, description="why the latest analysis failed")
    analysis_failed_at: datetime | None = Field(None, description="when it failed")
    data_quality_notes: list[DataQualityNote] = Field(
        default_factory=list, description="what the data this job sent lacked or had too much of"
    )


class StepOut(BaseModel):
    step: int
    step_time: float = Field(description="replayed step time with measured durations, seconds")
    ideal_time: float = Field(description="replayed step time with idealized durations, seconds")
    slowdown: float


class StepsOut(JobAttemptOut):
    steps: list[StepOut]


class TrendPoint(BaseModel):
    from_step: int
    to_step: int
    steps: int = Field(description="analysed steps folded into this point")
    start_time: datetime | None
    end_time: datetime | None
    step_time: float = Field(description="mean replayed step time with measured durations, seconds")
    ideal_time: float = Field(description="mean replayed step time with idealized durations, seconds")
    slowdown: float | None = Field(description="step_time / ideal_time")
    stragglers: list[int] = Field(description="ranks named stragglers by the passes that saw these steps")
    leading_cause: str


class TrendOut(JobAttemptOut):
    bucket_steps: int = Field(description="steps per stored bucket; points merge neighbouring buckets")
    points: list[TrendPoint]


class HeatmapOut(JobAttemptOut):
    metric: str
    ranks: list[int]
    steps: list[int]
    values: list[list[float | None]] = Field(description="values[i][j] for ranks[i], steps[j]")
    downsampled: bool = Field(False, description="cells are maxima over bins of ranks / steps")
    rank_ranges: list[list[int]] | None = Field(None, description="[first, last] rank of each row's bin")
    step_ranges: list[list[int]] | None = Field(None, description="[first, last] step of each column's bin")
    values_f32: str | None = Field(
        None, description="with encoding=f32: the cells as base64 little-endian float32, row-major; NaN: none"
    )


class WorkersOut(JobAttemptOut):
    dp_ranks: list[int]
    stages: list[int]
    values: list[list[float | None]] = Field(description="S_w: values[i][j] for dp_ranks[i], stages[j]")


class RankOut(BaseModel):
    rank: int
    host: str
    local_rank: int
    dp_rank: int
    stage: int
    tp_rank: int
    gpu_uuid: str


class RanksOut(JobAttemptOut):
    ranks: list[RankOut]


class AttemptOut(BaseModel):
    attempt: int
    state: str = Field(description="running, stalled or finished (one a newer attempt replaced is finished)")
    world_size: int
    last_step: int | None
    slowdown: float | None = Field(description="S of the attempt's latest analysis")
    gpu_hours_wasted: float
    first_seen: datetime
    last_seen: datetime
    reported_attempt: int | None = Field(
        description="the attempt identity its agents reported (a launcher's restart count), if any"
    )


class AttemptsOut(BaseModel):
    job_id: str
    attempts: list[AttemptOut] = Field(description="newest first")


class GpuSampleOut(BaseModel):
    time: float
    gpu_index: int
    gpu_uuid: str
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    gpu_util: float | None
    mem_used_bytes: float | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    throttle_reasons: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    xid_events: list[int]


class WorkerStepOut(BaseModel):
    step: int
    start_time: float = Field(description="when the step started, unix seconds on the server's clock")
    duration: float
    phases: dict[str, float]
    slowdown: float | None


class WorkerOut(JobAttemptOut):
    rank: int
    host: str
    dp_rank: int
    stage: int
    tp_rank: int
    gpu_uuid: str
    slowdown: float | None
    last_heartbeat: dict[str, Any] | None
    steps: list[WorkerStepOut]
    gpu: list[GpuSampleOut]


class HostCause(BaseModel):
    cause: str
    jobs: int = Field(description="distinct jobs in which the host's ranks straggled with this cause")


class XidOut(BaseModel):
    code: int
    time: datetime
    gpu_uuid: str


class GpuEventTotals(BaseModel):
    xid_count: int = 0
    ecc_uncorrected: int = Field(0, description="new uncorrectable ECC errors")
    throttle_seconds: dict[str, float] = Field(default_factory=dict, description="seconds by reason")


class HostGpuEventsOut(GpuEventTotals):
    xid: list[XidOut] = Field(
        default_factory=list, description="the newest XID errors (3 in a list row, 10 on the host page)"
    )
    gpus: dict[str, GpuEventTotals] = Field(
        default_factory=dict, description="the same per GPU UUID (on the host page only)"
    )


class HostOut(BaseModel):
    host: str
    jobs: int = Field(description="distinct jobs that ran ranks on the host in the period")
    straggler_jobs: int = Field(description="distinct jobs in which the host's own ranks straggled")
    gpu_hours_lost: float = Field(description="GPU-hours those jobs lost to the host's stragglers")
    causes: list[HostCause]
    gpu_events: HostGpuEventsOut
    gpu_faults: int = Field(description="XID errors plus new uncorrectable ECC errors")
    throttle_seconds: float
    suspect: bool
    suspect_jobs: int = Field(description="distinct straggler jobs within the suspect rule's days")
    last_incident: datetime | None
    incidents_by_day: list[int] = Field(description="incidents per day of the period, oldest first")
    first_seen: datetime | None
    last_seen: datetime | None


class HostsOut(BaseModel):
    hosts: list[HostOut]
    total: int
    limit: int
    offset: int
    since: datetime


class HostIncidentOut(BaseModel):
    job: str = Field(description="the job's id (DESIGN §6 names it `job`; the same as `job_id`)")
    job_id: str
    attempt: int
    rank: int
    gpu_uuid: str
    cause: str
    slowdown: float = Field(description="S_w: the worst a pass saw")
    job_slowdown: float | None
    gpu_hours_lost: float
    evidence: dict[str, Any]
    first_seen: datetime
    last_seen: datetime
    counts_toward_suspect: bool
    link: str = Field(description="the job's page in the dashboard")


class HostJobOut(BaseModel):
    job_id: str
    attempt: int
    ranks: int
    first_seen: datetime
    last_seen: datetime


class HostGpuEventOut(BaseModel):
    time: datetime
    kind: Literal["xid", "ecc_uncorrected", "throttle"]
    code: int | None = Field(None, description="the XID")
    reason: str | None = Field(None, description="the throttle reason")
    value: float = Field(description="1 per XID; new ECC errors; throttled seconds")
    job_id: str
    rank: int


class HostGpuOut(BaseModel):
    gpu_uuid: str
    events: list[HostGpuEventOut]


class HostRule(BaseModel):
    min_jobs: int
    days: float


class HostDetailOut(HostOut):
    since: datetime
    verdict: str = Field(description="why the host is or is not suspect")
    recommendation: str | None
    rule: HostRule
    incidents: list[HostIncidentOut]
    jobs_run: list[HostJobOut]
    gpus: list[HostGpuOut]
