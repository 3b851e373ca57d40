"""The DESIGN §6 JSON views of one analysis: the job summary, per-step series, worker grid, heatmap.

JSON has no NaN: undefined numbers (M_W with no slowdown, a worker never seen) become null. Keys of
`by_dp_rank` / `by_stage` are strings, as JSON object keys must be.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from smon_server.grid import Grid
from smon_server.series import StepSeries, json_floats
from smon_server.whatif.diagnosis import Diagnosis, Straggler
from smon_server.whatif.engine import WhatIfResult


def to_summary(
    result: WhatIfResult,
    diagnoses: Sequence[Diagnosis] = (),
    *,
    job_id: str | None = None,
    world_size: int | None = None,
    hosts: Mapping[int, str] | None = None,
    stragglers: Sequence[Straggler] = (),
    warmup_steps: int = 0,
    state: str | None = None,
) -> dict[str, Any]:
    """`stragglers` come from `diagnosis.stragglers()`, worst first."""
    hosts = hosts or {}
    a = result.attribution
    by_op_type = dict(sorted(result.by_op_type.items(), key=lambda kv: -kv[1]))
    return {
        "job_id": job_id,
        "state": state,
        "world_size": world_size,
        "steps_seen": len(result.steps),
        "from_step": int(result.steps[0]) if len(result.steps) else None,
        "to_step": int(result.steps[-1]) if len(result.steps) else None,
        "warmup_steps": warmup_steps,
        "estimator": result.config.estimator,
        "ideal_step_time": _f(result.ideal_step_time),
        "noise_floor": _f(result.noise_floor),
        "slowdown": _f(result.slowdown),
        "waste_fraction": _f(result.waste_fraction),
        "gpu_hours_wasted": _f(result.gpu_hours_wasted),
        "simulation_discrepancy": _f(result.discrepancy),
        "discrepancy_flagged": result.discrepancy_flagged,
        "m_w": _f(a.m_w) if a else None,
        "m_s": _f(a.m_s) if a else None,
        "attribution": {
            "by_op_type": {k: _f(v) for k, v in by_op_type.items()},
            "by_dp_rank": {str(k): _f(v) for k, v in result.by_dp_rank.items()},
            "by_stage": {str(k): _f(v) for k, v in result.by_stage.items()},
        },
        "stragglers": [_straggler(result, s, hosts) for s in stragglers],
        "diagnoses": [d.to_json() for d in diagnoses],
        "data_quality": {
            "rows_used": result.quality.rows_used,
            "dropped_steps": result.quality.dropped_steps,
            "duplicate_ops": result.quality.duplicate_ops,
            "absent_ops": result.quality.absent_ops,
            "reordered_instances": result.quality.reordered_instances,
            "missing_workers": result.quality.missing_workers,
            "invalid_rows": result.quality.invalid_rows,
            "device_timed_ops": result.quality.device_timed_ops,
            "host_line_ops": result.quality.host_line_ops,
        },
    }


def _straggler(result: WhatIfResult, s: Straggler, hosts: Mapping[int, str]) -> dict[str, Any]:
    rank = int(result.worker_rank[s.dp_index, s.stage_index])
    return {
        "rank": rank,
        "host": hosts.get(rank, ""),
        "dp_rank": int(result.dp_ranks[s.dp_index]),
        "stage": int(result.stages[s.stage_index]),
        "slowdown": _f(s.slowdown),
        "cause": s.cause,
        "evidence": s.evidence,
    }


def step_series(result: WhatIfResult) -> StepSeries:
    """Per step: simulated step time T_s(D), the step's ideal, and S_s."""
    ideal = result.step_ideal_time
    if ideal is None:
        ideal = np.full(result.step_time.shape, result.ideal_step_time)
    return StepSeries.of(result.steps, result.step_time, ideal, result.step_slowdown)


def worker_grid(result: WhatIfResult) -> dict[str, Any]:
    """The DP rank x stage grid of S_w (the paper's heatmap); values null without attribution."""
    a = result.attribution
    values = a.worker if a else np.full(result.worker_rank.shape, np.nan)
    return {
        "dp_ranks": result.dp_ranks.tolist(),
        "stages": result.stages.tolist(),
        "values": [json_floats(row) for row in values],
    }


def rank_heatmap(
    result: WhatIfResult, worker_ranks: Mapping[tuple[int, int], Sequence[int]] | None = None
) -> Grid:
    """Rank x step grid of S_w per step. Every rank of a worker (its TP / CP peers, when given)
    shows the worker's value."""
    a = result.attribution
    ranks: list[int] = []
    rows: list[tuple[int, int]] = []
    for d, dp in enumerate(result.dp_ranks):
        for s, stage in enumerate(result.stages):
            lead = int(result.worker_rank[d, s])
            found = list((worker_ranks or {}).get((int(dp), int(stage)), [])) or ([lead] if lead >= 0 else [])
            ranks.extend(int(r) for r in found)
            rows.extend((d, s) for _ in found)
    order = np.argsort(np.asarray(ranks, dtype=np.int64), kind="stable")
    n_steps = len(result.steps)
    if a is None or not rows:
        values = np.full((len(ranks), n_steps), np.nan, dtype=np.float32)
    else:
        d_idx = np.asarray([w[0] for w in rows], dtype=np.intp)
        s_idx = np.asarray([w[1] for w in rows], dtype=np.intp)
        values = a.worker_step[d_idx, s_idx].astype(np.float32)
        values[~np.isfinite(values)] = np.nan
    return Grid(
        ranks=np.asarray(ranks, dtype=np.int64)[order],
        steps=np.asarray(result.steps, dtype=np.int64),
        values=values[order] if len(ranks) else values,
    )


def _f(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None
