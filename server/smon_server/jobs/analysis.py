"""Analyse one live job: stored step records → op table → what-if engine → diagnosis → result.

The result is a dict of the API's views: `summary` (DESIGN §6 summary fields), `steps` (per-step
series), `workers` (DP × stage grid of S_w), `rank_slowdown` (rank × step heatmap of S_w, a
grid.Grid), `rank_overall` (S_w per rank), `state`; jobs/stored_result.py stores it.

This module conducts the pass: the window's op table (jobs/window_ops.py), the steps it treats
apart (jobs/step_ranges.py), the engine and its views (jobs/live.py), and what joins them to the
job (liveness, GPU health, hosts); the helpers live in the modules named for what they hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from smon_server.jobs import live, trend
from smon_server.jobs.gpu_health import gpu_health
from smon_server.jobs.liveness import JobState, Liveness, job_liveness
from smon_server.jobs.memory import release_freed_memory
from smon_server.jobs.step_ranges import recent_from, recent_steps_most, warmup_ranges, window_steps
from smon_server.jobs.window_cache import cache_key, process_cache
from smon_server.jobs.window_ops import window_ops
from smon_server.settings import Settings
from smon_server.store import phase_grids, queries
from smon_server.store.models import Job
from smon_server.store.queries import RankAgent, StepWindow
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.signals import HangState


def analyze_job(
    *,
    session: Session,
    job: Job,
    settings: Settings,
    now: float,
    window: StepWindow | None = None,
) -> dict[str, Any]:
    step_writes = job.step_writes  # before any record is read: a write after it is news
    agents, restarts = queries.agents_and_restarts(session=session, job=job)
    key = cache_key(str(session.get_bind().engine.url), job, agents, restarts)
    cache = process_cache(settings) if window is None else None
    span = None
    if window is None:
        # The default window: its newest steps found past the last pass's window where that
        # was contiguous, not by hopping over all of its steps again (~10 ms of 500 steps).
        known = cache.span((job.job_id, job.attempt), key) if cache is not None else None
        lo, hi, contiguous = queries.newest_window(
            session=session, job=job, last=window_steps(settings, len(agents)), known=known
        )
        span = (lo, hi) if contiguous and lo is not None and hi is not None else None
    else:
        lo, hi = queries.resolve_window(
            session=session, job=job, window=window, default_last=window_steps(settings, len(agents))
        )
    superseded, until = queries.later_attempt(session=session, job=job)  # GPU samples carry no attempt
    liveness = job_liveness(job, agents, now=now, stall_seconds=settings.stall_seconds, superseded=superseded)
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
        key=key,
        cache=cache,
        on_read=phases.add if phases is not None else None,
        skip=warm,  # dropped chunk by chunk: a copy of the whole table without them is ~0.6 GB
        span=span,
    )
    ops = built.ops
    if not built.incremental or (ops is not None and len(ops) >= TRIM_OPS):
        release_freed_memory()  # the chunks a cold build freed (~0.7 GB at 4,096 ranks) before the engine
    times = [t for t in built.times if not any(a <= t[0] < b for a, b in warm)] if ops is not None else []
    steps_analysed = [step for step, _, _ in times]
    window_start = min((t[1] for t in times), default=None)
    window_end = max((t[2] for t in times), default=None)
    samples = queries.gpu_samples(session=session, job_id=job.job_id, since=window_start, until=until)
    health = gpu_health(samples, agents)
    hosts = {a.rank: a.host for a in agents}
    gpus = max(job.world_size, len(agents), 1)
    elapsed_hours = 0.0
    if window_start is not None and window_end is not None:
        elapsed_hours = (window_end - window_start) / 3600.0

    grouped: dict[tuple[int, int], list[int]] = {}
    for a in agents:
        grouped.setdefault((a.dp_rank, a.pp_rank), []).append(a.rank)
    worker_ranks = {k: tuple(v) for k, v in grouped.items()}
    # What the engine kept of this window's last pass: only the new steps are laid out
    # (whatif/incremental.py). Taken out first: a failed analysis leaves nothing stale behind.
    reuse = None
    if built.engine is not None:
        reuse, built.engine.kept = built.engine.kept, None
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
        config=live_config(settings),
        warmup_steps=settings.warmup_steps,
        backend=_backend(agents),
        reuse=reuse,
        keep=True,  # for the next pass (when the window is cached) and the recent stretch's cut
    )
    del reuse
    kept = None
    if analysis.result is not None and analysis.result.prepared is not None:
        kept = analysis.result.prepared.kept
    if built.engine is not None:
        built.engine.kept = kept
    summary = analysis.summary
    summary.update(
        state=liveness.state.value,
        from_step=steps_analysed[0] if steps_analysed else lo,
        to_step=steps_analysed[-1] if steps_analysed else hi,
        steps_seen=len(steps_analysed),
        recent=None,
    )
    # The window's engine state (replays, attribution: hundreds of MB at 4,096 ranks) is not
    # needed past here; let it go before the recent stretch's engine run. What it kept for the
    # next pass (the measured durations, laid out) stays: the recent stretch is cut from it.
    step_seconds = float(analysis.result.step_time.mean()) if analysis.result is not None else None
    analysed_ok = analysis.result is not None
    analysis.result = None  # not trimmed here: the recent run reuses the freed heap (trimming
    # it cost ~0.5 CPU s of page faults for ~0.1 GB of peak)
    recent_first = recent_from(
        times, settings.recent_seconds, settings.recent_min_steps, recent_steps_most(settings, len(agents))
    )
    if ops is not None and analysed_ok and recent_first is not None:
        summary["recent"] = live.recent_stragglers(
            ops,
            recent_first,
            hosts=hosts,
            health=health,
            worker_ranks=worker_ranks,
            config=live_config(settings),
            backend=_backend(agents),
            within=kept,  # its layout cut from the window's (whatif/incremental.cut)
        )
    return {
        "state": liveness.state.value,
        "computed_at": now,
        "step_writes": step_writes,
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
        # The agents this analysis read: the pass charges the job's hosts from them (hosts/record.py)
        # rather than reading them again in the server process (~0.1 s at 16,384 ranks).
        "agents": agents if window is None else None,
    }


def live_config(settings: Settings) -> WhatIfConfig:
    """The engine's configuration for live jobs. Replays in single precision at every size (the
    engine's "auto" keeps double below a million ops): a live step's times are seconds within
    the step, where float32 resolves a microsecond at 10 s, and S moves in its seventh decimal, while
    a 64-rank window's engine costs ~25% less (docs/analysis.md "Precision")."""
    return WhatIfConfig(estimator=settings.estimator, precision="single")


# A later pass over a window this big (ops) trims too: below it, what the few new steps freed is
# small, and the trim (~2 ms) was a sizeable part of a small job's pass.
TRIM_OPS = 1_000_000


def _top_workers(overall: dict[int, float], agents: Sequence[RankAgent], k: int) -> list[dict[str, Any]]:
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


def _backend(agents: Sequence[RankAgent]) -> str:
    """The torch.distributed backend most agents report ("" when none says)."""
    reported = Counter(a.backend for a in agents if a.backend)
    return reported.most_common(1)[0][0] if reported else ""


def _hang_state(liveness: Liveness, stall_seconds: float) -> HangState | None:
    if liveness.state is not JobState.STALLED:
        return None
    return HangState(
        stalled=True,
        seconds_since_step=liveness.seconds_since_step,
        positions=liveness.positions,
        threshold_seconds=stall_seconds,
    )
