"""How an analysis runs: thresholds, the estimator of D*, replay precision and memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Estimator = Literal["paper", "robust"]


@dataclass(frozen=True)
class WhatIfConfig:
    attribution_threshold: float = 1.03  # attribute only at S >= this (DESIGN §5)
    straggling_threshold: float = 1.1  # a job is straggling at S >= this
    discrepancy_flag: float = 0.05  # |T_trace / T(D) - 1| above this: the window is not trusted
    top_worker_fraction: float = 0.03  # M_W idealises the top ceil(3%) of workers by S_w
    precision: Literal["auto", "double", "single"] = "auto"  # replay float width
    threads: int = 1  # replay threads; the replay is memory-bound, so >1 rarely pays (0: per CPU)
    memory_budget: int = 384 << 20  # bytes of replay buffers per thread
    force_attribution: bool = False  # attribute even below the threshold (tests, drill-down)
    align_clocks: bool = False  # estimate per-worker clock offsets from shared ends (clock.py)
    # D* of compute: "paper" = mean over every instance (Lin et al.; conformance), "robust" = the
    # same mean over the workers that do not stand out from their stage peers (durations.py).
    estimator: Estimator = "paper"
    outlier_tolerance: float = 0.10  # robust: a worker this much above its peers' typical time is out
    # robust: the healthy ideal keeps each instance's jitter up to this many robust sigmas (0: off)
    jitter_sigmas: float = 3.0
