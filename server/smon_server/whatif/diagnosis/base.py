"""Cause names, the finding record, and the numbers every rule shares (computed once, lazily)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from smon_server.whatif.engine import WhatIfResult
from smon_server.whatif.ops import OpTable
from smon_server.whatif.signals import Signals, unhealthy

SLOW_WORKER = "slow_worker"
GPU_THROTTLING = "gpu_throttling"
STAGE_IMBALANCE = "stage_imbalance"
SEQUENCE_IMBALANCE = "sequence_imbalance"
PYTHON_GC = "python_gc"
DATA_LOADER = "data_loader"
COMMUNICATION = "communication"
CHECKPOINT_IO = "checkpoint_io"
HOST_WORK = "host_work"
HANG = "hang"
CAUSES = (
    SLOW_WORKER, GPU_THROTTLING, STAGE_IMBALANCE, SEQUENCE_IMBALANCE, PYTHON_GC, DATA_LOADER,
    COMMUNICATION, CHECKPOINT_IO, HOST_WORK, HANG,
)  # fmt: skip


@dataclass(frozen=True)
class DiagnosisConfig:
    min_share: float = 0.1  # a straggler cause is named when it explains this much of S - 1
    # ... and when that part is worth someone's time: share × (S - 1) of the ideal step time.
    # The same 3% below which DESIGN §5 does not even attribute.
    min_excess: float = 0.03
    microbatch_cv: float = 0.1  # micro-batch compute varying this much is beyond hardware noise
    mobile_worst: float = 0.5  # the per-step slowest worker is "moving" below this persistence
    seq_correlation: float = 0.9  # compute ~ Σ len² fit that names sequence imbalance
    max_named_workers: int = 8
    # communication is named only when transfers themselves run this much over their ideal
    min_transfer_ratio: float = 1.2


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    share: float  # of the slowdown, in [0, 1] (checkpoint_io: of the step time; hang: 1)
    confidence: float
    evidence: dict[str, Any]
    recommendation: str
    workers: tuple[tuple[int, int], ...] = ()  # (dp rank, stage) it names
    ranks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Max-plus parts can overshoot a little (another part being slightly negative).
        object.__setattr__(self, "share", clip01(self.share))

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "share": _round(self.share),
            "confidence": _round(self.confidence),
            "evidence": self.evidence,
            "recommendation": self.recommendation,
        }


def _round(x: float) -> float:
    return round(float(x), 4) if math.isfinite(x) else float("nan")


def most_common(values: np.ndarray) -> int:
    """The most frequent of some integers (the interval between periodic spikes, in steps): by
    counting the distinct values, not a bincount up to the largest (steps 10^12 apart)."""
    distinct, counts = np.unique(values, return_counts=True)
    return int(distinct[int(np.argmax(counts))])


def clip01(x: float) -> float:
    return float(min(1.0, max(0.0, x))) if math.isfinite(x) else 0.0


def num(x: float, digits: int = 4) -> float:
    """A float for evidence: rounded to `digits` significant digits."""
    x = float(x)
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))


@dataclass
class Facts:
    """What the rules read: the result, its drill-down arrays, the signals, shared statistics."""

    table: OpTable
    result: WhatIfResult
    signals: Signals
    config: DiagnosisConfig
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def excess(self) -> float:
        """S - 1 in attribution's frame (against the jitter-free ideal), which shares divide."""
        return self.result.replay_slowdown - 1.0

    @cached_property
    def shares(self) -> dict[str, float]:
        a = self.result.attribution
        return {} if a is None else a.decomposition.shares()

    def addback_share(self, group: str) -> float:
        """(S_X - 1) / (S - 1) of one attribution group (an op type or a pp-comm family)."""
        value = self.result.by_op_type.get(group)
        if value is None or self.excess <= 1e-12:
            return 0.0
        return (value - 1.0) / self.excess

    @cached_property
    def steps_grid(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(measured [slot, step, dp], slot stage index, slot op type names) when available."""
        prep = self.result.prepared
        if prep is None:
            return None
        layout = prep.layout
        names = np.array([layout.type_name(j) for j in range(layout.n_slots)], dtype=object)
        return prep.durations.measured, layout.slot_stage, names

    def type_totals(self, *names: str) -> np.ndarray | None:
        """Seconds per [step, dp, stage] in the given op types (measured: transfer for comm)."""
        key = "totals:" + ",".join(names)
        if key not in self.cache:
            grid = self.steps_grid
            if grid is None or not np.isin(grid[2], names).any():
                self.cache[key] = None
            else:
                measured, slot_stage, slot_names = grid
                out = np.zeros((measured.shape[1], measured.shape[2], len(self.result.stages)))
                for s in range(out.shape[2]):
                    slots = np.flatnonzero((slot_stage == s) & np.isin(slot_names, names))
                    if slots.size:
                        out[:, :, s] = measured[slots].sum(axis=0, dtype=np.float64)
                self.cache[key] = out
        return self.cache[key]

    def worker(self, dp_index: int, stage_index: int) -> dict[str, Any]:
        """JSON-able identity of a worker: rank, host, dp_rank, stage."""
        rank = int(self.result.worker_rank[dp_index, stage_index])
        return {
            "rank": rank,
            "host": self.signals.hosts.get(rank, ""),
            "dp_rank": int(self.result.dp_ranks[dp_index]),
            "stage": int(self.result.stages[stage_index]),
        }

    def ranks_of(self, dp_index: int, stage_index: int) -> tuple[int, ...]:
        key = (int(self.result.dp_ranks[dp_index]), int(self.result.stages[stage_index]))
        ranks = self.signals.worker_ranks.get(key)
        if ranks:
            return tuple(ranks)
        rank = int(self.result.worker_rank[dp_index, stage_index])
        return (rank,) if rank >= 0 else ()

    def unhealthy_gpus(self, worker: tuple[int, int]) -> dict[str, dict[str, Any]]:
        """The worker's ranks whose GPU throttles or reports errors (signals.unhealthy), with
        the numbers that say so; empty when all look fine or nothing is known."""
        bad = {}
        for rank in self.ranks_of(*worker):
            h = self.signals.gpu.get(rank)
            if h is not None and unhealthy(h):
                bad[str(rank)] = {
                    "throttled_fraction": num(h.throttled_fraction),
                    "sm_clock_ratio": None if h.sm_clock_ratio is None else num(h.sm_clock_ratio),
                    "ecc_uncorrected": h.ecc_uncorrected,
                    "xid_events": h.xid_events,
                }
        return bad

    def where(self, dp_index: int, stage_index: int) -> str:
        """'rank 12 on host h1 (dp 3, stage 1)' for recommendations."""
        w = self.worker(dp_index, stage_index)
        rank = f"rank {w['rank']}" if w["rank"] >= 0 else "the worker"
        host = f" on {w['host']}" if w["host"] else ""
        stage = f", stage {w['stage']}" if len(self.result.stages) > 1 else ""
        return f"{rank}{host} (dp {w['dp_rank']}{stage})"
