"""One call for the live server: op table + signals -> every stored view of an analysis.

`analyze_live` never raises on bad or incomplete data: a window with no complete step yields a
summary with null numbers (and the hang diagnosis when the heartbeats say the job is stuck), so
the analysis loop can store something for every job on every pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from smon_server.grid import Grid
from smon_server.series import StepSeries
from smon_server.views.summary import rank_heatmap, step_series, to_summary, worker_grid
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.diagnosis import Diagnosis, diagnose_with_stragglers, stragglers
from smon_server.whatif.engine import Reusable, WhatIfResult, analyze
from smon_server.whatif.layout import AnalysisError
from smon_server.whatif.ops import OpTable
from smon_server.whatif.signals import GpuHealth, HangState, Signals


@dataclass
class LiveAnalysis:
    summary: dict[str, Any]  # DESIGN §6 summary fields
    steps: StepSeries = field(default_factory=StepSeries.empty)  # /steps series
    workers: dict[str, Any] = field(default_factory=dict)  # /workers: DP x stage grid of S_w
    rank_slowdown: Grid = field(default_factory=Grid.empty)  # rank x step heatmap of S_w
    rank_overall: dict[int, float] = field(default_factory=dict)  # S_w per rank
    result: WhatIfResult | None = None
    diagnoses: list[Diagnosis] = field(default_factory=list)
    error: str | None = None  # why there is no result, when there is none


def recent_stragglers(
    ops: OpTable,
    from_step: int,
    *,
    hosts: Mapping[int, str] | None = None,
    health: Mapping[int, GpuHealth] | None = None,
    worker_ranks: Mapping[tuple[int, int], Sequence[int]] | None = None,
    config: WhatIfConfig | None = None,
    backend: str = "",
    within: Reusable | None = None,
) -> dict[str, Any] | None:
    """S and the stragglers of the newest steps alone (`from_step` on), or None when there are
    too few. The window summary keeps its meaning (500 steps: a stable S, causes with evidence);
    this answers "who is straggling right now", within seconds of an onset. `within`: what the
    window's analysis kept (`result.prepared.kept`), whose layout these steps are cut from."""
    recent = ops.since(from_step)
    if len(recent) == 0:
        return None
    signals = Signals(
        gpu=dict(health or {}),
        hosts=dict(hosts or {}),
        worker_ranks=_tuples(worker_ranks),
        backend=backend,
    )
    try:
        result = analyze(recent, config=config, within=within)
    except AnalysisError:
        return None
    view = to_summary(result, stragglers=stragglers(recent, result, signals), hosts=hosts)
    return {key: view[key] for key in ("from_step", "to_step", "steps_seen", "slowdown", "stragglers")}


def analyze_live(
    ops: OpTable | None,
    *,
    gpus: int,
    elapsed_hours: float,
    hosts: Mapping[int, str] | None = None,
    health: Mapping[int, GpuHealth] | None = None,
    hang: HangState | None = None,
    worker_ranks: Mapping[tuple[int, int], Sequence[int]] | None = None,
    job_id: str | None = None,
    world_size: int | None = None,
    config: WhatIfConfig | None = None,
    warmup_steps: int = 0,
    backend: str = "",
    reuse: Reusable | None = None,
    keep: bool = False,
) -> LiveAnalysis:
    """`health` is keyed by global rank; any object with GpuHealth's fields works.
    `worker_ranks` maps (dp rank, stage) to all its ranks (TP / CP peers) for the per-rank views.
    `reuse` / `keep`: the engine's state from the last analysis of this window, and whether to
    keep it for the next (whatif/incremental.py; `result.prepared.kept`)."""
    signals = Signals(
        gpu=dict(health or {}),
        hang=hang,
        hosts=dict(hosts or {}),
        worker_ranks=_tuples(worker_ranks),
        backend=backend,
    )
    result: WhatIfResult | None = None
    error = None
    if ops is not None and len(ops):
        try:
            result = analyze(
                ops, gpus=gpus, elapsed_hours=elapsed_hours, config=config, reuse=reuse, keep=keep
            )
        except AnalysisError as e:
            error = str(e)
    else:
        error = "no operations in the window"
    diagnoses, named = diagnose_with_stragglers(ops, result, signals)
    if result is None:
        return LiveAnalysis(
            summary=_empty_summary(job_id, world_size, diagnoses, error, config, warmup_steps),
            diagnoses=diagnoses,
            error=error,
        )
    heatmap = rank_heatmap(result, worker_ranks)
    overall: dict[int, float] = {}
    a = result.attribution
    if a is not None:
        for d, dp in enumerate(result.dp_ranks):
            for s, stage in enumerate(result.stages):
                ranks = (worker_ranks or {}).get((int(dp), int(stage))) or [int(result.worker_rank[d, s])]
                overall.update({int(r): float(a.worker[d, s]) for r in ranks if r >= 0})
    return LiveAnalysis(
        summary=to_summary(
            result,
            diagnoses,
            job_id=job_id,
            world_size=world_size,
            hosts=hosts,
            stragglers=named,
            warmup_steps=warmup_steps,
        ),
        steps=step_series(result),
        workers=worker_grid(result),
        rank_slowdown=heatmap,
        rank_overall=overall,
        result=result,
        diagnoses=diagnoses,
    )


def empty_summary(job_id: str | None, world_size: int | None) -> dict[str, Any]:
    """The summary of an analysis with no numbers."""
    return _empty_summary(job_id, world_size, [], None, None, 0)


def _empty_summary(
    job_id: str | None,
    world_size: int | None,
    diagnoses: list[Diagnosis],
    error: str | None,
    config: WhatIfConfig | None,
    warmup_steps: int,
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "state": None,
        "world_size": world_size,
        "steps_seen": 0,
        "from_step": None,
        "to_step": None,
        "warmup_steps": warmup_steps,
        "estimator": (config or WhatIfConfig()).estimator,
        "ideal_step_time": None,
        "slowdown": None,
        "waste_fraction": None,
        "gpu_hours_wasted": None,
        "simulation_discrepancy": None,
        "discrepancy_flagged": False,
        "m_w": None,
        "m_s": None,
        "attribution": {"by_op_type": {}, "by_dp_rank": {}, "by_stage": {}},
        "stragglers": [],
        "diagnoses": [d.to_json() for d in diagnoses],
        "data_quality": {"error": error},
    }


def _tuples(
    worker_ranks: Mapping[tuple[int, int], Sequence[int]] | None,
) -> dict[tuple[int, int], tuple[int, ...]]:
    """Signals' worker → ranks map; a pass passes tuples already (16,384 copies were ~0.1 s)."""
    return {k: v if isinstance(v, tuple) else tuple(v) for k, v in (worker_ranks or {}).items()}
