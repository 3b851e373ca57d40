"""What-if slowdown of a job from its op table: S, per-step S_s, discrepancy, waste (DESIGN §5).

`analyze(table)` lays the table out, builds the step graph, splits transfer from waiting, derives
D*, and replays the graph for T(D) and T(D*); when S >= 1.03 it also runs every attribution
variant (attribution.py). Under the robust estimator the headline ideal is the *healthy* one, D*
plus each instance's ordinary jitter (durations.py), so S is what removing the stragglers would
buy; attribution stays relative to the jitter-free T(D*) (`jitter_free_step_time`). All
replays share one compiled program and run as a few large batches (batches.py).
"""

from __future__ import annotations

import math

import numpy as np

from smon_server.whatif.attribution import attribute
from smon_server.whatif.batches import (
    Prepared,
    Reusable,
    healthy_step_times,
    ideal_step_time,
    prepare,
    replay_restored,
)
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.ops import OpTable
from smon_server.whatif.result import Attribution, Decomposition, WhatIfResult

__all__ = [
    "Attribution",
    "Decomposition",
    "Prepared",
    "Reusable",
    "WhatIfConfig",
    "WhatIfResult",
    "analyze",
]


def analyze(
    table: OpTable,
    *,
    gpus: int | None = None,
    elapsed_hours: float | None = None,
    config: WhatIfConfig | None = None,
    reuse: Reusable | None = None,
    keep: bool = False,
    within: Reusable | None = None,
) -> WhatIfResult:
    """The what-if analysis of `table`. `gpus` and `elapsed_hours` (wall time of the analysed
    window) only feed `gpu_hours_wasted`. `reuse` / `keep`: what the last analysis of this
    window (slid on) kept, and whether to keep it for the next (`result.prepared.kept`;
    incremental.py); the result is the same either way. `within`: what the analysis of a
    window ending with `table`'s steps kept, to cut `table`'s layout from (the recent stretch)."""
    config = config or WhatIfConfig()
    offsets = None
    if config.align_clocks:
        from smon_server.whatif.clock import align_clocks

        table, offsets = align_clocks(table)
        reuse, keep, within = None, False, None  # the aligned table is a new one every time
    prep = prepare(table, config, reuse=reuse, keep=keep, within=within)
    ideal = ideal_step_time(prep)  # T(D*): attribution's reference
    step_time = replay_restored(prep, np.ones((1, prep.shape[0], prep.shape[2]), dtype=bool))[0]
    healthy = healthy_step_times(prep)  # robust: the ideal keeps ordinary jitter
    step_ideal = np.full_like(step_time, ideal) if healthy is None else healthy
    headline_ideal = float(step_ideal.mean())
    mean_time = float(step_time.mean())
    slowdown = _ratio(mean_time, headline_ideal)
    trace = prep.durations.trace_step_time
    discrepancy = _ratio(float(trace.mean()), mean_time)
    waste = 1.0 - 1.0 / slowdown if slowdown > 0 else 0.0
    attribution = None
    if slowdown >= config.attribution_threshold or config.force_attribution:
        attribution = attribute(prep, step_time, ideal, config.top_worker_fraction)
    hours = None
    if gpus is not None and elapsed_hours is not None:
        hours = max(waste, 0.0) * gpus * elapsed_hours
    layout = prep.layout
    return WhatIfResult(
        steps=layout.steps,
        dp_ranks=layout.dp_ranks,
        stages=layout.stages,
        worker_rank=layout.ranks,
        trace_step_time=trace,
        step_time=step_time,
        ideal_step_time=headline_ideal,
        slowdown=slowdown,
        step_slowdown=np.divide(step_time, step_ideal, out=np.ones_like(step_time), where=step_ideal > 0),
        discrepancy=discrepancy,
        step_discrepancy=np.divide(trace, step_time, out=np.ones_like(trace), where=step_time > 0),
        discrepancy_flagged=abs(discrepancy - 1.0) > config.discrepancy_flag,
        waste_fraction=waste,
        gpu_hours_wasted=hours,
        ideal_durations=prep.durations.ideal_by_type,
        quality=layout.quality,
        config=config,
        attribution=attribution,
        clock_offsets=offsets,
        prepared=prep,
        step_ideal_time=step_ideal,
        jitter_free_step_time=ideal,
    )


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return 1.0 if a <= 0 else math.inf
