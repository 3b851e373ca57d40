"""Signals beyond the op table that diagnosis can use, filled by the server where it has them.

All optional: the offline analyzer has none of them, and every rule works without them (with less
confidence where a signal would have decided between two causes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuHealth:
    """One rank's GPU over the analysed window (NVML samples)."""

    samples: int
    throttled_fraction: float  # samples with a thermal / power throttle reason bit set
    sm_clock_ratio: float | None  # mean SM clock / max SM clock
    ecc_uncorrected: int  # new uncorrected ECC errors in the window
    xid_events: int


@dataclass(frozen=True)
class RankPosition:
    """Where one rank stands according to its last heartbeat."""

    rank: int
    step: int | None
    phase: str  # "" when no phase is open
    host: str = ""


@dataclass(frozen=True)
class HangState:
    stalled: bool  # the server's verdict: heartbeats arrive but no step completes
    seconds_since_step: float
    positions: tuple[RankPosition, ...] = ()
    threshold_seconds: float = 120.0  # SMON_STALL_SECONDS


@dataclass(frozen=True)
class Signals:
    gpu: Mapping[int, GpuHealth] = field(default_factory=dict)  # by global rank
    hang: HangState | None = None
    hosts: Mapping[int, str] = field(default_factory=dict)  # global rank -> host
    # Every global rank of each worker (TP / CP peers included); the op table only carries one.
    worker_ranks: Mapping[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    backend: str = ""  # torch.distributed backend the agents report ("nccl", "gloo"); "" unknown


def unhealthy(h: GpuHealth) -> bool:
    """Throttling in at least 5% of samples, SM clock 10% under max, or hardware errors.

    Reads fields only, so any object with GpuHealth's fields will do (the server has its own)."""
    return (
        h.throttled_fraction >= 0.05
        or (h.sm_clock_ratio is not None and h.sm_clock_ratio <= 0.9)
        or h.ecc_uncorrected > 0
        or h.xid_events > 0
    )
