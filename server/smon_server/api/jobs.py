"""/api/v1/jobs: what the analysis found, per job, per step, per rank and per worker."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from smon_server.api.deps import ApiTokenDep, ContextDep, DbDep, SettingsDep, WindowDep
from smon_server.api.schemas import (
    GpuSampleOut,
    HeatmapOut,
    JobOut,
    JobsOut,
    StepOut,
    StepsOut,
    SummaryOut,
    WorkerOut,
    WorkersOut,
    WorkerStepOut,
)
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs import loop
from smon_server.jobs.liveness import job_liveness
from smon_server.store import queries
from smon_server.store.models import Job
from smon_server.store.queries import StepWindow

router = APIRouter(prefix="/api/v1", tags=["jobs"])


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _job_or_404(db: DbDep, job_id: str) -> Job:
    job = queries.get_job(session=db, job_id=job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return job


@router.get("/jobs", response_model=JobsOut)
def list_jobs(db: DbDep, context: ContextDep, _auth: ApiTokenDep) -> JobsOut:
    now = time.time()
    results = queries.results_by_job(session=db)
    agents = queries.agents_by_job(session=db)
    out = []
    for job in queries.list_jobs(session=db):
        liveness = job_liveness(
            job, agents.get(job.job_id, []), now=now, stall_seconds=context.settings.stall_seconds
        )
        result = results.get(job.job_id)
        state = liveness.state.value
        if result is not None and result.result.get("state") != state:
            # Finished or stalled since its last analysis: analyse it now, so the state is never
            # shown next to numbers of another one.
            # (or another replica / the loop did it while we waited for the lease: re-read anyway)
            loop.analyse_one(context, job.job_id, now, state_change_only=True)
            db.rollback()  # end the read snapshot: see the result just stored
            result = queries.get_result(session=db, job_id=job.job_id)
            state = result.result.get("state", state) if result is not None else state
        out.append(
            JobOut(
                job_id=job.job_id,
                state=state,
                world_size=job.world_size,
                last_step=job.last_step,
                slowdown=result.slowdown if result else None,
                waste_fraction=result.waste_fraction if result else None,
                gpu_hours_wasted=job.gpu_hours_wasted,
                first_seen=_ts(job.first_seen),
                last_seen=_ts(job.last_seen),
            )
        )
    return JobsOut(jobs=out)


def _analysis(db: DbDep, context: ContextDep, job: Job, window: StepWindow) -> dict[str, Any]:
    """The stored analysis (brought up to date first if the job changed state since), or a fresh
    one when the caller asks for another window. Its `state` is the one it was computed in."""
    now = time.time()
    if window.is_default:
        loop.analyse_one(context, job.job_id, now, state_change_only=True)
        db.rollback()  # end the read snapshot: see the result just stored
        stored = queries.get_result(session=db, job_id=job.job_id)
        if stored is not None:
            return stored.result
    return job_analysis.analyze_job(session=db, job=job, settings=context.settings, now=now, window=window)


@router.get("/jobs/{job_id}/summary", response_model=SummaryOut)
def summary(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
) -> SummaryOut:
    job = _job_or_404(db, job_id)
    result = _analysis(db, context, job, window)
    body = dict(result["summary"])
    body.update(
        job_id=job.job_id,
        state=result["state"],
        world_size=job.world_size,
        # The job's running total; another window reports its own figure.
        gpu_hours_wasted=job.gpu_hours_wasted if window.is_default else body.get("gpu_hours_wasted", 0.0),
        computed_at=_ts(result["computed_at"]) if result.get("computed_at") else None,
    )
    return SummaryOut.model_validate(body)


@router.get("/jobs/{job_id}/steps", response_model=StepsOut)
def steps(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
) -> StepsOut:
    job = _job_or_404(db, job_id)
    result = _analysis(db, context, job, window)
    return StepsOut(job_id=job_id, steps=[StepOut(**s) for s in result["steps"]])


@router.get("/jobs/{job_id}/heatmap", response_model=HeatmapOut)
def heatmap(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
    metric: Annotated[str, Query(description="slowdown, step_time, or a phase name")] = "slowdown",
) -> HeatmapOut:
    job = _job_or_404(db, job_id)
    if metric == "slowdown":
        grid = _analysis(db, context, job, window)["rank_slowdown"]
    else:
        grid = job_analysis.phase_heatmap(
            session=db,
            job=job,
            metric=metric,
            window=window,
            default_last=settings.analysis_window_steps,
        )
    return HeatmapOut(job_id=job_id, metric=metric, **grid)


@router.get("/jobs/{job_id}/workers", response_model=WorkersOut)
def workers(
    job_id: str,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
) -> WorkersOut:
    job = _job_or_404(db, job_id)
    result = _analysis(db, context, job, window)
    return WorkersOut(job_id=job_id, **result["workers"])


@router.get("/jobs/{job_id}/workers/{rank}", response_model=WorkerOut)
def worker(
    job_id: str,
    rank: int,
    db: DbDep,
    settings: SettingsDep,
    context: ContextDep,
    _auth: ApiTokenDep,
    window: WindowDep,
) -> WorkerOut:
    job = _job_or_404(db, job_id)
    agent = next((a for a in queries.job_agents(session=db, job_id=job_id) if a.rank == rank), None)
    if agent is None:
        raise HTTPException(status_code=404, detail=f"job {job_id!r} has no rank {rank}")
    result = _analysis(db, context, job, window)
    grid = result["rank_slowdown"]
    per_step: dict[int, float | None] = {}
    if rank in grid["ranks"]:
        row = grid["values"][grid["ranks"].index(rank)]
        per_step = dict(zip(grid["steps"], row, strict=True))
    lo, hi = queries.resolve_window(
        session=db, job_id=job_id, window=window, default_last=settings.analysis_window_steps
    )
    records = [
        r for r in queries.step_rows(session=db, job_id=job_id, from_step=lo, to_step=hi) if r.rank == rank
    ]
    heartbeat = None
    if agent.hb_time is not None:
        heartbeat = {
            "time": agent.hb_time,
            "last_step": agent.hb_last_step,
            "current_step": agent.hb_current_step,
            "phase": agent.hb_phase,
            "phase_since": agent.hb_phase_since,
        }
    samples = queries.gpu_samples(session=db, job_id=job_id, rank=rank, limit=1000)
    return WorkerOut(
        job_id=job_id,
        rank=rank,
        host=agent.host,
        dp_rank=agent.dp_rank,
        stage=agent.pp_rank,
        tp_rank=agent.tp_rank,
        gpu_uuid=agent.gpu_uuid,
        slowdown=result.get("rank_overall", {}).get(str(rank)),
        last_heartbeat=heartbeat,
        steps=[
            WorkerStepOut(
                step=r.step,
                duration=r.duration,
                phases={k: float(v) for k, v in r.phases.items()},
                slowdown=per_step.get(r.step),
            )
            for r in records
        ],
        gpu=[GpuSampleOut.model_validate(s, from_attributes=True) for s in reversed(samples)],
    )
