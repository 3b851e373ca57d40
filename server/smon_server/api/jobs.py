"""/api/v1/jobs: what the analysis found, per job, per step, per rank and per worker.

A job id may have several attempts (restarts under the same id, store/attempts.py): every job
route shows the newest unless `?attempt=N` asks for another, and says which (`attempt`, of
`attempts`)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, HTTPException, Path, Query, Response
from sqlalchemy import select

from smon_server.api.deps import (
    MAX_RANK,
    MAX_STEP,
    ApiTokenDep,
    AttemptDep,
    ContextDep,
    DbDep,
    SettingsDep,
    WindowDep,
)
from smon_server.api.schemas import (
    AttemptOut,
    AttemptsOut,
    DataQualityNote,
    GpuSampleOut,
    HeatmapOut,
    JobOut,
    JobsOut,
    RankOut,
    RanksOut,
    StepOut,
    StepsOut,
    SummaryOut,
    TrendOut,
    TrendPoint,
    WorkerOut,
    WorkersOut,
    WorkerStepOut,
    utc,
)
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs import failures, loop, phase_heatmap, refresh, trend
from smon_server.jobs.liveness import JobState, job_state
from smon_server.settings import Settings
from smon_server.store import grids, queries
from smon_server.store.db import DATABASE_UNAVAILABLE
from smon_server.store.models import AnalysisResult, Job
from smon_server.store.queries import StepWindow
from smon_server.store.step_window import read_window
from smon_server.views import heatmap as heatmaps
from smon_server.whatif.config import WhatIfConfig

router = APIRouter(prefix="/api/v1", tags=["jobs"])
STRAGGLING = WhatIfConfig().straggling_threshold


def _job_or_404(db: DbDep, job_id: str, attempt: int | None = None) -> Job:
    """The job's attempt `attempt`, or its newest."""
    job = queries.get_job(session=db, job_id=job_id, attempt=attempt)
    if job is None:
        if attempt is not None and queries.get_job(session=db, job_id=job_id) is not None:
            raise HTTPException(status_code=404, detail=f"job {job_id!r} has no attempt {attempt}")
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return job


def _which(db: DbDep, job: Job, asked: int | None) -> dict[str, int]:
    """`attempt` and `attempts` of a response: the newest attempt (nothing asked) is the count."""
    count = job.attempt if asked is None else queries.attempt_count(session=db, job_id=job.job_id)
    return {"attempt": job.attempt, "attempts": count}


@router.get("/jobs", response_model=JobsOut)
def list_jobs(
    db: DbDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    straggling: Annotated[bool | None, Query(description="only jobs with S >= 1.1 (or below)")] = None,
    q: Annotated[str | None, Query(max_length=256, description="job id contains this")] = None,
    job_id: Annotated[str | None, Query(max_length=256, description="exactly this job")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
) -> JobsOut:
    """Newest first. Filtered, counted and paged in the database; no job's analysis is decoded."""
    now = time.time()
    page, total = queries.job_page(
        session=db,
        now=now,
        stall_seconds=context.settings.stall_seconds,
        state=state.value if state is not None else None,
        slowdown_at_least=STRAGGLING if straggling is True else None,
        slowdown_below=STRAGGLING if straggling is False else None,
        contains=q,
        job_id=job_id,
        limit=limit,
        offset=offset,
    )
    out = []
    for row in page:
        job, result = row.job, row.result
        if result is not None and result.state != row.live_state:
            # Finished or stalled since its last analysis: analyse it now, so the state is never
            # shown next to numbers of another one (or another replica / the loop did it while
            # we waited for the lease: re-read anyway).
            loop.analyse_one(context, job.job_id, now, attempt=job.attempt, state_change_only=True)
            db.rollback()  # end the read snapshot: see the result just stored
            result = queries.result_of(session=db, job=job)
        out.append(
            JobOut(
                job_id=job.job_id,
                attempt=job.attempt,
                attempts=job.attempt,  # the list shows each job's newest attempt
                state=result.state if result is not None and result.state else row.live_state,
                world_size=job.world_size,
                last_step=job.last_step,
                slowdown=result.slowdown if result else None,
                waste_fraction=result.waste_fraction if result else None,
                gpu_hours_wasted=job.gpu_hours_wasted,
                first_seen=utc(job.first_seen),
                last_seen=utc(job.last_seen),
                stragglers=result.stragglers if result else 0,
                worst_rank=result.worst_rank if result else None,
                leading_cause=(result.leading_cause or None) if result else None,
                computed_at=utc(result.computed_at) if result else None,
                analysis_error=(result.error or None) if result else None,
            )
        )
    return JobsOut(jobs=out, total=total, limit=limit, offset=offset)


def _analysis(db: DbDep, context: ContextDep, job: Job, window: StepWindow, *parts: str) -> dict[str, Any]:
    """The stored analysis's `parts` (brought up to date first if the job changed state since), or
    a fresh analysis when the caller asks for another window. `state` is the one it was computed
    in. Only the columns asked for are read: a summary never loads the heatmap."""
    now = time.time()
    if window.is_default:
        loop.analyse_one(context, job.job_id, now, attempt=job.attempt, state_change_only=True)
        db.rollback()  # end the read snapshot: see the result just stored
        stored = queries.result_parts(session=db, job_id=job.job_id, attempt=job.attempt, parts=parts)
        if stored is not None:
            if "heatmap" in stored:
                stored["heatmap"] = grids.unpack(stored["heatmap"])
            return stored
    try:
        fresh = job_analysis.analyze_job(
            session=db, job=job, settings=context.settings, now=now, window=window
        )
    except DATABASE_UNAVAILABLE:
        raise
    except Exception as exc:  # this job's data broke its analysis: say so, as the stored one does
        db.rollback()
        state = refresh.current_state(
            session=db, job=job, stall_seconds=context.settings.stall_seconds, now=now
        )
        return failures.failed_result(job, state.value, exc)
    fresh["heatmap"] = fresh["rank_slowdown"]
    return fresh


@router.get("/jobs/{job_id:path}/summary", response_model=SummaryOut)
def summary(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
    attempt: AttemptDep = None,
) -> SummaryOut:
    job = _job_or_404(db, job_id, attempt)
    result = _analysis(db, context, job, window, "summary")
    body = dict(result["summary"] or {})
    body.update(
        job_id=job.job_id,
        **_which(db, job, attempt),
        state=result["state"],
        world_size=job.world_size,
        # The job's running total; another window reports its own figure.
        gpu_hours_wasted=job.gpu_hours_wasted if window.is_default else body.get("gpu_hours_wasted") or 0.0,
        computed_at=utc(result["computed_at"]) if result.get("computed_at") else None,
        analysis_state="failed" if result.get("error") else "ok",
        analysis_error=result.get("error") or None,
        analysis_failed_at=utc(result["error_at"])
        if result.get("error") and result.get("error_at")
        else None,
        data_quality_notes=_notes(job, settings, body.get("data_quality") or {}),
    )
    return SummaryOut.model_validate(body)


def _notes(job: Job, settings: Settings, quality: dict[str, Any]) -> list[DataQualityNote]:
    """What the job's data lacked or had too much of, as ingest counted it, and how the analysis
    read what it had."""
    notes = []
    host_line, device_timed = (
        int(quality.get("host_line_ops") or 0),
        int(quality.get("device_timed_ops") or 0),
    )
    if host_line:
        notes.append(
            DataQualityNote(
                kind="device_time_behind_host",
                count=host_line,
                message=f"{host_line} of {device_timed} device-timed phases ran on steps where the device "
                "waited for the host, and were replayed by the host's time: device work that grew "
                "there without delaying the host is not counted as slowdown. The phases shown are "
                "the device's time",
            )
        )
    if job.folded_spans:
        notes.append(
            DataQualityNote(
                kind="phase_names_folded",
                count=job.folded_spans,
                message=f"{job.folded_spans} spans of phases named after this job's first "
                f"{settings.max_phase_names} custom phase names (first: {job.folded_example!r}) were "
                "stored as `other`: name phases with a fixed set of names (not one per step, like "
                "f'eval:{step}'), or raise SMON_MAX_PHASE_NAMES",
            )
        )
    return notes


@router.get("/jobs/{job_id:path}/steps", response_model=StepsOut)
def steps(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
    attempt: AttemptDep = None,
) -> StepsOut:
    job = _job_or_404(db, job_id, attempt)
    result = _analysis(db, context, job, window, "steps")
    return StepsOut(
        job_id=job_id, **_which(db, job, attempt), steps=[StepOut(**s) for s in result["steps"] or []]
    )


@router.get("/jobs/{job_id:path}/trend", response_model=TrendOut)
def job_trend(
    job_id: str,
    db: DbDep,
    _auth: ApiTokenDep,
    from_step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    to_step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    max_points: Annotated[int, Query(ge=1, le=5000)] = 500,
    attempt: AttemptDep = None,
) -> TrendOut:
    """The job attempt's whole history (beyond the analysis window, after its raw steps are
    dropped), in buckets of steps merged to at most `max_points` points."""
    job = _job_or_404(db, job_id, attempt)
    points = trend.read(
        db, job.job_id, attempt=job.attempt, from_step=from_step, to_step=to_step, max_points=max_points
    )
    for p in points:
        p["start_time"] = utc(p["start_time"]) if p["start_time"] is not None else None
        p["end_time"] = utc(p["end_time"]) if p["end_time"] is not None else None
    return TrendOut(
        job_id=job.job_id,
        **_which(db, job, attempt),
        bucket_steps=trend.BUCKET_STEPS,
        points=[TrendPoint(**p) for p in points],
    )


@router.get("/jobs/{job_id:path}/heatmap", response_model=HeatmapOut)
def heatmap(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
    metric: Annotated[
        str, Query(min_length=1, max_length=128, description="slowdown, step_time, other, gc, or a phase")
    ] = "slowdown",
    from_rank: Annotated[int | None, Query(ge=0, le=MAX_RANK, description="zoom: first rank")] = None,
    to_rank: Annotated[int | None, Query(ge=0, le=MAX_RANK, description="zoom: last rank")] = None,
    max_ranks: Annotated[int, Query(ge=1, le=8192, description="rows at most (max over each bin)")] = 512,
    max_steps: Annotated[int, Query(ge=1, le=8192, description="columns at most")] = 512,
    encoding: Annotated[
        Literal["json", "f32"],
        Query(description="f32: cells as base64 float32 in `values_f32` (NaN: none), `values` empty"),
    ] = "json",
    attempt: AttemptDep = None,
) -> Response:
    """Every metric is read in the shape it is stored: the slowdown grid from the stored analysis,
    a phase's from the per-step columns the analysis pass stores (store/phase_grids.py), only
    the zoomed ranks' bytes. The body is written with array operations (views/heatmap.py)."""
    job = _job_or_404(db, job_id, attempt)
    if metric == "slowdown":
        grid = None
        if window.last is None:
            # A step range inside the stored window (a zoom) is cut from the stored analysis, as a
            # phase's is: analysing it afresh would take a pass's time on a big job for cells
            # whose per-step S_w differ only by the range's own D*.
            stored = _analysis(db, context, job, StepWindow(), "heatmap")["heatmap"]
            if _covers(stored, window):
                grid = stored
        if grid is None:
            grid = _analysis(db, context, job, window, "heatmap")["heatmap"]
    else:
        grid = phase_heatmap.phase_heatmap(
            session=db,
            job=job,
            metric=metric,
            window=window,
            default_last=settings.analysis_window_steps,
            from_rank=from_rank,
            to_rank=to_rank,
        )
    grid = heatmaps.select(
        grid, from_rank=from_rank, to_rank=to_rank, from_step=window.from_step, to_step=window.to_step
    )
    body = heatmaps.response_json(
        grid,
        job_id=job_id,
        metric=metric,
        max_ranks=max_ranks,
        max_steps=max_steps,
        encoding=encoding,
        **_which(db, job, attempt),
    )
    return Response(content=body, media_type="application/json")


def _covers(grid: grids.Grid | None, window: StepWindow) -> bool:
    if grid is None or not grid.steps.size:
        return False
    return (window.from_step is None or window.from_step >= int(grid.steps[0])) and (
        window.to_step is None or window.to_step <= int(grid.steps[-1])
    )


@router.get("/jobs/{job_id:path}/workers", response_model=WorkersOut)
def workers(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
    attempt: AttemptDep = None,
) -> WorkersOut:
    job = _job_or_404(db, job_id, attempt)
    result = _analysis(db, context, job, window, "workers")
    grid = result["workers"] or {"dp_ranks": [], "stages": [], "values": []}
    return WorkersOut.model_validate({"job_id": job_id, **_which(db, job, attempt), **grid})


@router.get("/jobs/{job_id:path}/attempts", response_model=AttemptsOut)
def job_attempts(job_id: str, db: DbDep, settings: SettingsDep, _auth: ApiTokenDep) -> AttemptsOut:
    """The job's attempts (restarts under the same id), newest first: what `?attempt=` takes."""
    found = queries.job_attempts(session=db, job_id=job_id)
    if not found:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    results = {
        r.attempt: r for r in db.scalars(select(AnalysisResult).where(AnalysisResult.job_id == job_id))
    }
    newest = found[0]
    all_final, heard = queries.liveness_facts(session=db, job=newest)
    live = job_state(
        newest, all_final=all_final, last_heard=heard, now=time.time(), stall_seconds=settings.stall_seconds
    ).value
    return AttemptsOut(
        job_id=job_id,
        attempts=[
            AttemptOut(
                attempt=a.attempt,
                state=live if a is newest else JobState.FINISHED.value,
                world_size=a.world_size,
                last_step=a.last_step,
                slowdown=results[a.attempt].slowdown if a.attempt in results else None,
                gpu_hours_wasted=a.gpu_hours_wasted,
                first_seen=utc(a.first_seen),
                last_seen=utc(a.last_seen),
                reported_attempt=a.reported_attempt,
            )
            for a in found
        ],
    )


@router.get("/jobs/{job_id:path}/ranks", response_model=RanksOut)
def ranks(job_id: str, db: DbDep, _auth: ApiTokenDep, attempt: AttemptDep = None) -> RanksOut:
    """Where each rank runs (its newest agent: a restarted rank reports under a new one), so a
    view can group ranks by host."""
    job = _job_or_404(db, job_id, attempt)
    return RanksOut(
        job_id=job_id,
        **_which(db, job, attempt),
        ranks=[
            RankOut(
                rank=a.rank,
                host=a.host,
                local_rank=a.local_rank,
                dp_rank=a.dp_rank,
                stage=a.pp_rank,
                tp_rank=a.tp_rank,
                gpu_uuid=a.gpu_uuid,
            )
            for a in queries.job_agents(session=db, job=job)
        ],
    )


@router.get("/jobs/{job_id:path}/workers/{rank}", response_model=WorkerOut)
def worker(
    job_id: str,
    rank: Annotated[int, Path(ge=0, le=MAX_RANK)],
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
    attempt: AttemptDep = None,
) -> WorkerOut:
    job = _job_or_404(db, job_id, attempt)
    agent = next((a for a in queries.job_agents(session=db, job=job) if a.rank == rank), None)
    if agent is None:
        raise HTTPException(status_code=404, detail=f"job {job_id!r} has no rank {rank}")
    result = _analysis(db, context, job, window, "heatmap", "rank_overall")
    grid = result["heatmap"]
    per_step: dict[int, float | None] = {}
    found = np.flatnonzero(grid.ranks == rank)
    if found.size:
        row = grid.values[int(found[0])]
        per_step = {int(s): (None if np.isnan(v) else float(v)) for s, v in zip(grid.steps, row, strict=True)}
    lo, hi = queries.resolve_window(
        session=db, job=job, window=window, default_last=settings.analysis_window_steps
    )
    records = read_window(session=db, job=job, from_step=lo, to_step=hi, rank=rank)
    phases = records.phase_table()
    heartbeat = None
    if agent.hb_time is not None:
        heartbeat = {
            "time": agent.hb_time,
            "last_step": agent.hb_last_step,
            "current_step": agent.hb_current_step,
            "phase": agent.hb_phase,
            "phase_since": agent.hb_phase_since,
        }
    since, until = queries.attempt_span(session=db, job=job)
    samples = queries.gpu_samples(session=db, job_id=job_id, rank=rank, since=since, until=until, limit=1000)
    return WorkerOut(
        job_id=job_id,
        **_which(db, job, attempt),
        rank=rank,
        host=agent.host,
        dp_rank=agent.dp_rank,
        stage=agent.pp_rank,
        tp_rank=agent.tp_rank,
        gpu_uuid=agent.gpu_uuid,
        slowdown=(result.get("rank_overall") or {}).get(str(rank)),
        last_heartbeat=heartbeat,
        steps=[
            WorkerStepOut(
                step=int(step),
                start_time=float(records.start_time[i]),
                duration=float(records.duration[i]),
                phases={name: float(v[i]) for name, v in phases.items() if not np.isnan(v[i])},
                slowdown=per_step.get(int(step)),
            )
            for i, step in enumerate(records.step)
        ],
        gpu=[GpuSampleOut.model_validate(s, from_attributes=True) for s in reversed(samples)],
    )
