"""/api/v1/jobs: what the analysis found, per job, per step, per rank and per worker.

A job id may have several attempts (restarts under the same id, store/attempts.py): every job
route shows the newest unless `?attempt=N` asks for another, and says which (`attempt`, of
`attempts`); the job is resolved once per request (deps.JobDep).

Routes only read. The analysis pass (jobs/loop.py) analyses and stores each job's default window;
routes serve what it stored. A job whose state changed since its stored analysis (finished or
stalled since) is served as stored, in the state the numbers were computed in, and the loop is
woken to store the new one at once (docs/server.md "Reads"). Another step window is analysed by
jobs/windows.py in the analysis workers, bounded, cached and timed. The routes are sync functions,
run in FastAPI's threadpool: their database reads are synchronous SQLAlchemy, and a window's
analysis is a concurrent.futures.Future the thread waits on (at most SMON_WINDOW_ANALYSIS_TIMEOUT
seconds; at most windows.IN_FLIGHT analyses run at once, the next is a 503), so the event loop is
never blocked and an async route would only have moved the same reads onto threads itself."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, HTTPException, Path, Query, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.api.deps import (
    MAX_RANK,
    MAX_STEP,
    ApiContext,
    ApiTokenDep,
    ContextDep,
    DbDep,
    JobDep,
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
from smon_server.grid import Grid
from smon_server.jobs import phase_heatmap, refresh, trend, windows
from smon_server.jobs.liveness import JobState, job_state
from smon_server.jobs.step_ranges import window_steps
from smon_server.settings import Settings
from smon_server.store import grids, queries, step_series
from smon_server.store.models import AnalysisResult, Job
from smon_server.store.queries import StepWindow
from smon_server.store.step_window import read_window
from smon_server.views import heatmap as heatmaps

router = APIRouter(prefix="/api/v1", tags=["jobs"])


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
    """Newest first. Filtered, counted and paged in the database; no job's analysis is decoded.
    A job shows the state its stored numbers were computed in; one that has left it since wakes
    the loop, which stores the new state's analysis at once."""
    page, total = queries.job_page(
        session=db,
        now=time.time(),
        stall_seconds=context.settings.stall_seconds,
        state=state.value if state is not None else None,
        slowdown_at_least=context.straggling_threshold if straggling is True else None,
        slowdown_below=context.straggling_threshold if straggling is False else None,
        contains=q,
        job_id=job_id,
        limit=limit,
        offset=offset,
    )
    if any(row.result is not None and row.result.state != row.live_state for row in page):
        context.request_pass()
    out = []
    for row in page:
        job, result = row.job, row.result
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


def _analysis(db: Session, context: ApiContext, job: Job, window: StepWindow, *parts: str) -> dict[str, Any]:
    """The stored analysis's `parts` for the default window, or an analysis of another window
    (or of a job the pass has not analysed yet) from jobs/windows.py. `state` is the one the
    numbers were computed in: a job that left it since wakes the loop and is served as stored.
    Only the columns asked for are read: a summary never loads the heatmap."""
    if window.is_default:
        stored = queries.result_parts(session=db, job_id=job.job_id, attempt=job.attempt, parts=parts)
        if stored is not None:
            now = time.time()
            live = refresh.current_state(
                session=db, job=job, stall_seconds=context.settings.stall_seconds, now=now
            )
            if stored["state"] != live.value:
                context.request_pass()
            if "heatmap" in stored:
                stored["heatmap"] = grids.unpack(stored["heatmap"])
            if "steps" in stored:
                stored["steps"] = step_series.unpack(stored["steps"])
            return stored
        context.request_pass()  # not analysed yet: the pass does so now; this request meanwhile
    try:
        return dict(context.windows.analyse(db, job, window))
    except windows.Busy as exc:
        raise HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": "5"}) from None
    except windows.TimedOut as exc:
        raise HTTPException(status_code=504, detail=str(exc), headers={"Retry-After": "10"}) from None
    except windows.Gone:
        raise HTTPException(status_code=404, detail=f"no job {job.job_id!r}") from None


@router.get("/jobs/{job_id:path}/summary", response_model=SummaryOut)
def summary(
    resolved: JobDep,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
) -> SummaryOut:
    job = resolved.job
    result = _analysis(db, context, job, window, "summary")
    body = dict(result["summary"] or {})
    body.update(
        job_id=job.job_id,
        **resolved.which,
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
    resolved: JobDep, db: DbDep, context: ContextDep, _auth: ApiTokenDep, window: WindowDep
) -> StepsOut:
    job = resolved.job
    result = _analysis(db, context, job, window, "steps")
    return StepsOut(job_id=job.job_id, **resolved.which, steps=[StepOut(**s) for s in result["steps"].rows()])


@router.get("/jobs/{job_id:path}/trend", response_model=TrendOut)
def job_trend(
    resolved: JobDep,
    db: DbDep,
    _auth: ApiTokenDep,
    from_step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    to_step: Annotated[int | None, Query(ge=0, le=MAX_STEP)] = None,
    max_points: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> TrendOut:
    """The job attempt's whole history (beyond the analysis window, after its raw steps are
    dropped), in buckets of steps merged to at most `max_points` points."""
    job = resolved.job
    points = trend.read(
        db, job.job_id, attempt=job.attempt, from_step=from_step, to_step=to_step, max_points=max_points
    )
    for p in points:
        p["start_time"] = utc(p["start_time"]) if p["start_time"] is not None else None
        p["end_time"] = utc(p["end_time"]) if p["end_time"] is not None else None
    return TrendOut(
        job_id=job.job_id,
        **resolved.which,
        bucket_steps=trend.BUCKET_STEPS,
        points=[TrendPoint(**p) for p in points],
    )


@router.get("/jobs/{job_id:path}/heatmap", response_model=HeatmapOut)
def heatmap(
    resolved: JobDep,
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
) -> Response:
    """Every metric is read in the shape it is stored: the slowdown grid from the stored analysis,
    a phase's from the per-step columns the analysis pass stores (store/phase_grids.py), only
    the zoomed ranks' bytes. The body is written with array operations (views/heatmap.py)."""
    job = resolved.job
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
            default_last=window_steps(settings, queries.reporting_ranks(session=db, job=job)),
            from_rank=from_rank,
            to_rank=to_rank,
        )
    grid = heatmaps.select(
        grid, from_rank=from_rank, to_rank=to_rank, from_step=window.from_step, to_step=window.to_step
    )
    body = heatmaps.response_json(
        grid,
        job_id=job.job_id,
        metric=metric,
        max_ranks=max_ranks,
        max_steps=max_steps,
        encoding=encoding,
        **resolved.which,
    )
    return Response(content=body, media_type="application/json")


def _covers(grid: Grid | None, window: StepWindow) -> bool:
    if grid is None or not grid.steps.size:
        return False
    return (window.from_step is None or window.from_step >= int(grid.steps[0])) and (
        window.to_step is None or window.to_step <= int(grid.steps[-1])
    )


@router.get("/jobs/{job_id:path}/workers", response_model=WorkersOut)
def workers(
    resolved: JobDep, db: DbDep, context: ContextDep, _auth: ApiTokenDep, window: WindowDep
) -> WorkersOut:
    job = resolved.job
    result = _analysis(db, context, job, window, "workers")
    grid = result["workers"] or {"dp_ranks": [], "stages": [], "values": []}
    return WorkersOut.model_validate({"job_id": job.job_id, **resolved.which, **grid})


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
def ranks(resolved: JobDep, db: DbDep, _auth: ApiTokenDep) -> RanksOut:
    """Where each rank runs (its newest agent: a restarted rank reports under a new one), so a
    view can group ranks by host."""
    job = resolved.job
    return RanksOut(
        job_id=job.job_id,
        **resolved.which,
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
    resolved: JobDep,
    rank: Annotated[int, Path(ge=0, le=MAX_RANK)],
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
) -> WorkerOut:
    job = resolved.job
    agent = next((a for a in queries.job_agents(session=db, job=job) if a.rank == rank), None)
    if agent is None:
        raise HTTPException(status_code=404, detail=f"job {job.job_id!r} has no rank {rank}")
    result = _analysis(db, context, job, window, "heatmap", "rank_overall")
    grid = result["heatmap"]
    per_step: dict[int, float | None] = {}
    found = np.flatnonzero(grid.ranks == rank)
    if found.size:
        row = grid.values[int(found[0])]
        per_step = {int(s): (None if np.isnan(v) else float(v)) for s, v in zip(grid.steps, row, strict=True)}
    lo, hi = queries.resolve_window(
        session=db,
        job=job,
        window=window,
        default_last=window_steps(settings, queries.reporting_ranks(session=db, job=job)),
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
    samples = queries.gpu_samples(
        session=db, job_id=job.job_id, rank=rank, since=since, until=until, limit=1000
    )
    return WorkerOut(
        job_id=job.job_id,
        **resolved.which,
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
