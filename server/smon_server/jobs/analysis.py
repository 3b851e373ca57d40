"""Analyse one live job: stored step records → op table → what-if engine → diagnosis → result.

The result is a dict of the API's views: `summary` (DESIGN §6 summary fields), `steps` (per-step
series), `workers` (DP × stage grid of S_w), `rank_slowdown` (rank × step heatmap of S_w, a
store.grids.Grid), `rank_overall` (S_w per rank), `state`. `store_result` puts each view in a
column of its own, so the API reads only what it serves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from smon_server.jobs import live, trend
from smon_server.jobs.gpu_health import gpu_health
from smon_server.jobs.liveness import JobState, Liveness, job_liveness, job_state
from smon_server.jobs.memory import release_freed_memory
from smon_server.jobs.window_cache import cache_key, process_cache
from smon_server.jobs.window_ops import window_ops
from smon_server.jobs.workers import WORKER_DIED
from smon_server.settings import Settings
from smon_server.store import grids, phase_grids, queries
from smon_server.store.grids import Grid
from smon_server.store.models import Agent, AnalysisResult, Job
from smon_server.store.queries import StepWindow
from smon_server.store.step_window import read_window
from smon_server.views import heatmap as heatmaps
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.signals import HangState


def needs_refresh(
    *,
    session: Session,
    job: Job,
    previous: AnalysisResult,
    settings: Settings,
    now: float,
    state_change_only: bool = False,
) -> bool:
    """New steps arrived, or the job's state changed (a stall must be diagnosed while it lasts).
    A pass that failed counts as the latest: the job is tried again once new steps arrive."""
    if previous.error == WORKER_DIED and not state_change_only:
        return True  # killed once: perhaps for another process's memory (jobs/workers.py)
    since = max(previous.computed_at, previous.error_at or previous.computed_at)
    new_steps = job.last_step_seen is not None and job.last_step_seen > since
    if new_steps and not state_change_only:
        return True
    state = current_state(session=session, job=job, stall_seconds=settings.stall_seconds, now=now)
    if state.value != previous.state:
        return True
    return state is JobState.STALLED and not state_change_only and not previous.error


def current_state(*, session: Session, job: Job, stall_seconds: float, now: float) -> JobState:
    """The job attempt's state now, from two aggregates (not every agent row: this runs before
    each API read of a 4,096-rank job)."""
    all_final, heard = queries.liveness_facts(session=session, job=job)
    return job_state(
        job,
        all_final=all_final,
        last_heard=heard,
        now=now,
        stall_seconds=stall_seconds,
        superseded=queries.is_superseded(session=session, job=job),
    )


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
        job=job,
        window=window or StepWindow(),
        default_last=settings.analysis_window_steps,
    )
    agents = queries.job_agents(session=session, job=job)
    superseded = queries.is_superseded(session=session, job=job)
    liveness = job_liveness(job, agents, now=now, stall_seconds=settings.stall_seconds, superseded=superseded)
    restarts = queries.restart_steps(session=session, job=job)
    warm = warmup_ranges(restarts, settings.warmup_steps)
    # The default window slides with the job: its op table is kept between passes and only the
    # new steps are read and built. A window asked for by the API is built on its own. The
    # default window's records also become the stored phase heatmaps (store/phase_grids.py).
    phases = phase_grids.Collector() if window is None else None
    built = window_ops(
        session=session,
        job=job,
        lo=lo,
        hi=hi,
        key=cache_key(str(session.get_bind().engine.url), job, agents, restarts),
        cache=process_cache(settings) if window is None else None,
        on_read=phases.add if phases is not None else None,
        skip=warm,  # dropped chunk by chunk: a copy of the whole table without them is ~0.6 GB
    )
    release_freed_memory()  # the chunks a cold build freed (~0.7 GB at 4,096 ranks) before the engine
    ops = built.ops
    times = [t for t in built.times if not any(a <= t[0] < b for a, b in warm)] if ops is not None else []
    steps_analysed = [step for step, _, _ in times]
    window_start = min((t[1] for t in times), default=None)
    window_end = max((t[2] for t in times), default=None)
    _, until = queries.attempt_span(session=session, job=job)  # samples carry no attempt
    samples = queries.gpu_samples(session=session, job_id=job.job_id, since=window_start, until=until)
    health = gpu_health(samples, agents)
    hosts = {a.rank: a.host for a in agents}
    gpus = max(job.world_size, len(agents), 1)
    elapsed_hours = 0.0
    if window_start is not None and window_end is not None:
        elapsed_hours = (window_end - window_start) / 3600.0

    worker_ranks: dict[tuple[int, int], list[int]] = {}
    for a in agents:
        worker_ranks.setdefault((a.dp_rank, a.pp_rank), []).append(a.rank)
    analysis = live.analyze_live(
        ops,
        gpus=gpus,
        elapsed_hours=elapsed_hours,
        hosts=hosts,
        health=health,
        hang=_hang_state(liveness, settings.stall_seconds),
        worker_ranks=worker_ranks,
        job_id=job.job_id,
        world_size=job.world_size,
        config=WhatIfConfig(estimator=settings.estimator),
        warmup_steps=settings.warmup_steps,
        backend=_backend(agents),
    )
    summary = analysis.summary
    summary.update(
        state=liveness.state.value,
        from_step=steps_analysed[0] if steps_analysed else lo,
        to_step=steps_analysed[-1] if steps_analysed else hi,
        steps_seen=len(steps_analysed),
        recent=None,
    )
    # The window's engine state (layout, replays: hundreds of MB at 4,096 ranks) is not needed
    # past here; let it go before the recent stretch's engine run builds its own.
    step_seconds = float(analysis.result.step_time.mean()) if analysis.result is not None else None
    analysed_ok = analysis.result is not None
    analysis.result = None  # not trimmed here: the recent run reuses the freed heap (trimming
    # it cost ~0.5 CPU s of page faults for ~0.1 GB of peak)
    recent_from = _recent_from(
        times, settings.recent_seconds, settings.recent_min_steps, settings.recent_max_steps
    )
    if ops is not None and analysed_ok and recent_from is not None:
        summary["recent"] = live.recent_stragglers(
            ops,
            recent_from,
            hosts=hosts,
            health=health,
            worker_ranks=worker_ranks,
            config=WhatIfConfig(estimator=settings.estimator),
            backend=_backend(agents),
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
        "trend": trend.buckets(analysis.steps, times),
        "step_seconds": step_seconds,
        "top_workers": _top_workers(analysis.rank_overall, agents, settings.metrics_top_k),
        "phase_columns": phases.update(lo) if phases is not None else None,
    }


def _top_workers(overall: dict[int, float], agents: Sequence[Agent], k: int) -> list[dict[str, Any]]:
    """The k ranks with the largest S_w, with what joins them to GPU metrics (host, GPU UUID)."""
    by_rank = {a.rank: a for a in agents}
    ranked = sorted(overall.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [
        {
            "rank": rank,
            "host": by_rank[rank].host if rank in by_rank else "",
            "gpu_uuid": by_rank[rank].gpu_uuid if rank in by_rank else "",
            "slowdown": value,
        }
        for rank, value in ranked
    ]


def store_result(row: AnalysisResult, result: dict[str, Any]) -> None:
    """Fill the stored row: the scalars lists read, and each API view in a column of its own."""
    summary = result["summary"]
    stragglers = summary.get("stragglers") or []
    diagnoses = summary.get("diagnoses") or []
    row.computed_at = result["computed_at"]
    row.state = result["state"]
    row.from_step = summary.get("from_step")
    row.to_step = summary.get("to_step")
    row.steps_seen = summary.get("steps_seen", 0)
    row.slowdown = summary.get("slowdown")
    row.waste_fraction = summary.get("waste_fraction")
    row.window_start = result.get("window_start")
    row.window_end = result.get("window_end")
    row.stragglers = len(stragglers)
    row.worst_rank = stragglers[0]["rank"] if stragglers else None
    row.leading_cause = str(diagnoses[0]["cause"])[:32] if diagnoses else ""
    row.flagged = bool(summary.get("discrepancy_flagged"))
    recent = summary.get("recent") or {}
    row.recent_slowdown = recent.get("slowdown")
    row.recent_stragglers = [
        {"rank": s["rank"], "host": s["host"], "cause": s["cause"]} for s in recent.get("stragglers") or []
    ]
    row.step_seconds = result.get("step_seconds")
    row.top_workers = result.get("top_workers") or []
    row.summary = summary
    row.steps = result["steps"]
    row.workers = result["workers"]
    row.rank_overall = result["rank_overall"]
    row.heatmap = grids.pack(result["rank_slowdown"])


def restate_result(row: AnalysisResult, result: dict[str, Any]) -> None:
    """Only the state and time of a stored result move on (its steps are no longer stored)."""
    row.state = result["state"]
    row.computed_at = result["computed_at"]
    row.summary = {**(row.summary or {}), "state": result["state"]}


def _recent_from(
    times: Sequence[tuple[int, float, float]], seconds: float, min_steps: int, max_steps: int | None = None
) -> int | None:
    """First step of the recent stretch: the steps that ended within `seconds` of the newest, at
    least `min_steps` and at most `max_steps` of them; None when that is the whole window (the
    window's answer stands)."""
    if len(times) <= min_steps:
        return None
    newest = max(end for _, _, end in times)
    ordered = sorted(times)
    recent = [step for step, _, end in ordered if end >= newest - seconds]
    first = min(recent[0] if recent else ordered[-1][0], ordered[-min_steps][0])
    most = None if max_steps is None else max(max_steps, min_steps)  # the minimum wins
    if most is not None and len(ordered) > most:
        first = max(first, ordered[-most][0])
    return None if first <= ordered[0][0] else first


def warmup_ranges(starts: Sequence[int], warmup_steps: int) -> list[tuple[int, int]]:
    """[first, first + warmup) for every start or restart of the job's agents."""
    return [(s, s + warmup_steps) for s in starts] if warmup_steps > 0 else []


def _backend(agents: Sequence[Agent]) -> str:
    """The torch.distributed backend most agents report ("" when none says)."""
    reported = Counter(a.backend for a in agents if a.backend)
    return reported.most_common(1)[0][0] if reported else ""


def phase_heatmap(
    *,
    session: Session,
    job: Job,
    metric: str,
    window: StepWindow,
    default_last: int,
    from_rank: int | None = None,
    to_rank: int | None = None,
) -> Grid:
    """Rank × step grid of one phase's seconds (or `step_time`, `gc`, `other`), of the ranks in
    [from_rank, to_rank] with a record in the window.

    Steps the last analysis pass stored (store/phase_grids.py) are read from there; the default
    window is what it stored, as for the slowdown heatmap. Steps of an asked-for range outside
    it (older history, steps since the pass) come from the raw records, as they did before."""
    code = phase_grids.metric_code(session, job.key, metric)
    stored = phase_grids.stored_range(session, job.key)
    lo: int | None
    hi: int | None
    if window.is_default and stored is not None:
        lo, hi = stored
    else:
        lo, hi = queries.resolve_window(session=session, job=job, window=window, default_last=default_last)
        if lo is None and hi is None and window.is_default:
            return Grid.empty()
    if stored is None:
        return _raw_phase_grid(session, job, metric, lo, hi, from_rank, to_rank)
    low, high = -(2**63) if lo is None else lo, 2**63 - 1 if hi is None else hi
    parts = []
    if low < stored[0]:
        parts.append(_raw_phase_grid(session, job, metric, lo, min(high, stored[0] - 1), from_rank, to_rank))
    if low <= stored[1] and high >= stored[0]:
        parts.append(
            phase_grids.read(
                session,
                job.key,
                code,
                from_step=max(low, stored[0]),
                to_step=min(high, stored[1]),
                from_rank=from_rank,
                to_rank=to_rank,
            )
        )
    if high > stored[1]:
        parts.append(_raw_phase_grid(session, job, metric, max(low, stored[1] + 1), hi, from_rank, to_rank))
    return grids.concat_steps(parts)


def _raw_phase_grid(
    session: Session,
    job: Job,
    metric: str,
    lo: int | None,
    hi: int | None,
    from_rank: int | None,
    to_rank: int | None,
) -> Grid:
    """The grid from the raw records of steps [lo, hi] (every rank read and decoded)."""
    records = read_window(session=session, job=job, from_step=lo, to_step=hi)
    ranks, rank_index = np.unique(records.rank, return_inverse=True)
    steps, step_index = np.unique(records.step, return_inverse=True)
    values = np.full((ranks.size, steps.size), np.nan, dtype=np.float32)
    values[rank_index, step_index] = (
        records.duration if metric == "step_time" else records.phase_seconds(metric)
    )
    grid = Grid(ranks.astype(np.int64), steps.astype(np.int64), values)
    return heatmaps.select(grid, from_rank=from_rank, to_rank=to_rank, from_step=None, to_step=None)


def _hang_state(liveness: Liveness, stall_seconds: float) -> HangState | None:
    if liveness.state is not JobState.STALLED:
        return None
    return HangState(
        stalled=True,
        seconds_since_step=liveness.seconds_since_step,
        positions=liveness.positions,
        threshold_seconds=stall_seconds,
    )
