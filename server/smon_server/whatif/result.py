"""What an analysis returns: the configuration, the result, and its attribution parts.

Plain dataclasses over numpy arrays (axes documented per field); `summary.py` renders them as JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from smon_server.whatif.batches import Prepared
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.layout import LayoutQuality


@dataclass(frozen=True)
class Decomposition:
    """Step-time ratios over T(D*) of partial restorations (attribution.py explains the parts)."""

    slowdown: float  # S
    stage: float  # compute at each stage's typical time
    worker: float  # compute at each worker's own mean time
    compute: float  # all forward / backward compute measured (S of that family)
    communication: float  # all communication measured

    def shares(self) -> dict[str, float]:
        """Parts of the excess S - 1; they sum to 1 (0 each when there is no excess)."""
        excess = self.slowdown - 1.0
        if excess <= 1e-12:
            return {"stage": 0.0, "worker": 0.0, "transient": 0.0, "rest": 0.0}
        return {
            "stage": (self.stage - 1.0) / excess,
            "worker": (self.worker - self.stage) / excess,
            "transient": (self.compute - self.worker) / excess,
            "rest": (self.slowdown - self.compute) / excess,
        }


@dataclass(frozen=True)
class Attribution:
    """Add-back slowdowns S_X (overall and per step) and the removal metrics."""

    op_groups: tuple[str, ...]
    op_type: np.ndarray  # [n_groups]
    op_type_step: np.ndarray  # [n_groups, n_steps]
    dp: np.ndarray  # [n_dp]
    dp_step: np.ndarray  # [n_dp, n_steps]
    stage: np.ndarray  # [n_stages]
    stage_step: np.ndarray  # [n_stages, n_steps]
    worker: np.ndarray  # [n_dp, n_stages]: S_w = min(S_dp, S_stage); NaN for a missing worker
    worker_step: np.ndarray  # [n_dp, n_stages, n_steps]
    top_workers: tuple[tuple[int, int], ...]  # (dp rank, stage) ids, worst first
    m_w: float
    m_s: float
    m_w_add: float  # (T(D*) with the top workers restored - T(D*)) / (T(D) - T(D*))
    m_s_add: float
    decomposition: Decomposition


@dataclass(frozen=True)
class WhatIfResult:
    steps: np.ndarray  # [n_steps] step numbers analysed
    dp_ranks: np.ndarray  # [n_dp] DP rank ids
    stages: np.ndarray  # [n_stages] stage ids
    worker_rank: np.ndarray  # [n_dp, n_stages] global rank of each worker, -1 unknown
    trace_step_time: np.ndarray  # [n_steps] recorded: latest end - earliest start
    step_time: np.ndarray  # [n_steps] T_s(D): replayed with measured durations, no launch delay
    ideal_step_time: float  # mean ideal step: T(D*), or under the robust estimator the healthy ideal
    slowdown: float  # S
    step_slowdown: np.ndarray  # [n_steps] S_s
    discrepancy: float  # mean T_trace / mean T(D)
    step_discrepancy: np.ndarray  # [n_steps]
    discrepancy_flagged: bool
    waste_fraction: float  # 1 - 1/S
    gpu_hours_wasted: float | None  # waste x GPUs x elapsed hours, when both were given
    ideal_durations: dict[str, float]  # D* per op type
    quality: LayoutQuality
    config: WhatIfConfig
    attribution: Attribution | None = None  # None when S < threshold
    clock_offsets: dict[tuple[int, int], float] | None = None  # with config.align_clocks
    prepared: Prepared | None = field(default=None, repr=False)  # for diagnosis drill-down
    step_ideal_time: np.ndarray | None = None  # [n_steps] the ideal of each step
    jitter_free_step_time: float | None = None  # T(D*), attribution's reference

    @property
    def noise_floor(self) -> float:
        """Healthy ideal over the jitter-free one: what ordinary jitter alone costs (1 = none)."""
        free = self.jitter_free_step_time
        return self.ideal_step_time / free if free else 1.0

    @property
    def replay_slowdown(self) -> float:
        """T(D) / T(D*): S in attribution's frame, where the S_X and S_w live."""
        free = self.jitter_free_step_time or self.ideal_step_time
        return float(self.step_time.mean()) / free if free > 0 else 1.0

    @property
    def straggling(self) -> bool:
        return self.slowdown >= self.config.straggling_threshold

    @property
    def by_op_type(self) -> dict[str, float]:
        a = self.attribution
        return {} if a is None else dict(zip(a.op_groups, a.op_type.tolist(), strict=True))

    @property
    def by_dp_rank(self) -> dict[int, float]:
        a = self.attribution
        return {} if a is None else dict(zip(self.dp_ranks.tolist(), a.dp.tolist(), strict=True))

    @property
    def by_stage(self) -> dict[int, float]:
        a = self.attribution
        return {} if a is None else dict(zip(self.stages.tolist(), a.stage.tolist(), strict=True))

    def per_step(self, kind: Literal["op_type", "dp_rank", "stage"]) -> dict[int, dict[object, float]]:
        """{step: {X: S_X,s}} like the artifact's `blocking_decompose_by_*_per_step`."""
        a = self.attribution
        if a is None:
            return {}
        names: Sequence[object]
        if kind == "op_type":
            names, values = a.op_groups, a.op_type_step
        elif kind == "dp_rank":
            names, values = self.dp_ranks.tolist(), a.dp_step
        else:
            names, values = self.stages.tolist(), a.stage_step
        return {
            int(step): dict(zip(names, values[:, i].tolist(), strict=True))
            for i, step in enumerate(self.steps)
        }
