"""Analyse one live job: stored step records → op table → what-if engine → diagnosis → result.

The result is one JSON-able dict, stored per job and served by the API as is:
`summary` (DESIGN §6 summary fields), `steps` (per-step series), `workers` (DP × stage grid of
S_w), `rank_slowdown` (rank × step heatmap of S_w), `rank_overall` (S_w per rank), `state`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from smon_server.analysis import live
from smon_server.analysis.from_steps import build_op_table, complete_steps
from smon_server.analysis.liveness import JobState, Liveness, job_liveness
from smon_server.analysis.signals import GpuHealth, HangState
from smon_server.settings import Settings
from smon_server.store import queries
from smon_server.store.models import Agent, AnalysisResult, GpuSample, Job
from smon_server.store.queries import StepWindow

# NVML clock-event reasons that mean the GPU slowed itself down (not idle / app clocks).
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, brake


def needs_refresh(
    *, session: Session, job: Job, previous: AnalysisResult, settings: Settings, now: float
) -> bool:
    """New steps arrived, or the job's state changed (a stall must be diagnosed while it lasts)."""
    if job.last_step_seen is not None and job.last_step_seen > previous.computed_at:
        return True
    liveness = job_liveness(
        job,
        queries.job_agents(session=session, job_id=job.job_id),
        now=now,
        stall_seconds=settings.stall_seconds,
    )
    if liveness.state.value != previous.result.get("state"):
        return True
    return liveness.state is JobState.STALLED


def analyze_job(
    *,
    session: Session,
    job: Job,
    settings: Settings,
    now: float,
    window: StepWindow | None = None,
) -> dict[str, Any]:
    lo, hi = queries.resolve_window(
        session=session,
        job_id=job.job_id,
        window=window or StepWindow(),
        default_last=settings.analysis_window_steps,
    )
    agents = queries.job_agents(session=session, job_id=job.job_id)
    liveness = job_liveness(job, agents, now=now, stall_seconds=settings.stall_seconds)
    rows = complete_steps(queries.step_rows(session=session, job_id=job.job_id, from_step=lo, to_step=hi))
    times = queries.step_times(session=session, job_id=job.job_id, from_step=lo, to_step=hi)
    window_start = min((t[1] for t in times), default=None)
    window_end = max((t[2] for t in times), default=None)
    health = _gpu_health(queries.gpu_samples(session=session, job_id=job.job_id, since=window_start), agents)
    hosts = {a.rank: a.host for a in agents}
    gpus = max(job.world_size, len(agents), 1)
    elapsed_hours = 0.0
    if window_start is not None and window_end is not None:
        elapsed_hours = (window_end - window_start) / 3600.0

    worker_ranks: dict[tuple[int, int], list[int]] = {}
    for a in agents:
        worker_ranks.setdefault((a.dp_rank, a.pp_rank), []).append(a.rank)
    analysis = live.analyze_live(
        build_op_table(rows) if rows else None,
        gpus=gpus,
        elapsed_hours=elapsed_hours,
        hosts=hosts,
        health=health,
        hang=_hang_state(liveness, settings.stall_seconds),
        worker_ranks=worker_ranks,
        job_id=job.job_id,
        world_size=job.world_size,
    )
    summary = analysis.summary
    summary.update(
        from_step=min((r.step for r in rows), default=lo),
        to_step=max((r.step for r in rows), default=hi),
        steps_seen=len({r.step for r in rows}),
    )
    return {
        "state": liveness.state.value,
        "computed_at": now,
        "window_start": window_start,
        "window_end": window_end,
        "summary": summary,
        "steps": analysis.steps,
        "workers": analysis.workers,
        "rank_slowdown": analysis.rank_slowdown,
        "rank_overall": {str(k): v for k, v in analysis.rank_overall.items()},
    }


def accumulate_waste(*, job: Job, result: dict[str, Any]) -> None:
    """Add waste × GPUs × the wall time of steps not counted before to the job's running total."""
    end = result.get("window_end")
    start = result.get("window_start")
    waste = result["summary"].get("waste_fraction")
    if end is None or start is None or waste is None or not math.isfinite(waste):
        return
    counted_from = max(start, job.wasted_until or start)
    if end <= counted_from:
        return
    gpus = max(job.world_size, 1)
    job.gpu_hours_wasted = (job.gpu_hours_wasted or 0.0) + max(waste, 0.0) * gpus * (
        end - counted_from
    ) / 3600.0
    job.wasted_until = end


def phase_heatmap(
    *,
    session: Session,
    job: Job,
    metric: str,
    window: StepWindow,
    default_last: int,
) -> dict[str, Any]:
    """Rank × step grid of one phase's seconds (or `step_time`) straight from the records."""
    lo, hi = queries.resolve_window(
        session=session, job_id=job.job_id, window=window, default_last=default_last
    )
    rows = queries.step_rows(session=session, job_id=job.job_id, from_step=lo, to_step=hi)
    ranks = sorted({r.rank for r in rows})
    steps = sorted({r.step for r in rows})
    r_index = {r: i for i, r in enumerate(ranks)}
    s_index = {s: j for j, s in enumerate(steps)}
    values: list[list[float | None]] = [[None] * len(steps) for _ in ranks]
    for r in rows:
        value = r.duration if metric == "step_time" else r.phases.get(metric)
        if value is not None:
            values[r_index[r.rank]][s_index[r.step]] = float(value)
    return {"ranks": ranks, "steps": steps, "values": values}


def _gpu_health(samples: Sequence[GpuSample], agents: Sequence[Agent]) -> dict[int, GpuHealth]:
    """Per rank: how often its GPU throttled, its SM clock vs max, and its error counts."""
    by_rank: dict[int, list[GpuSample]] = {}
    for s in samples:
        by_rank.setdefault(s.rank, []).append(s)
    out: dict[int, GpuHealth] = {}
    for rank, rows in by_rank.items():
        throttled = [
            s.throttle_reasons is not None and bool(s.throttle_reasons & THROTTLE_BITS) for s in rows
        ]
        ratios = [
            s.sm_clock_mhz / s.sm_clock_max_mhz
            for s in rows
            if s.sm_clock_mhz is not None and s.sm_clock_max_mhz
        ]
        ecc = [s.ecc_uncorrected for s in rows if s.ecc_uncorrected is not None]
        out[rank] = GpuHealth(
            samples=len(rows),
            throttled_fraction=sum(throttled) / len(rows),
            sm_clock_ratio=float(np.mean(ratios)) if ratios else None,
            ecc_uncorrected=(max(ecc) - min(ecc)) if len(ecc) > 1 else (ecc[0] if ecc else 0),
            xid_events=sum(len(s.xid_events or []) for s in rows),
        )
    return out


def _hang_state(liveness: Liveness, stall_seconds: float) -> HangState | None:
    if liveness.state is not JobState.STALLED:
        return None
    return HangState(
        stalled=True,
        seconds_since_step=liveness.seconds_since_step,
        positions=liveness.positions,
        threshold_seconds=stall_seconds,
    )
