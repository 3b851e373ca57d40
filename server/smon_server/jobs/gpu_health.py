"""Per-rank GPU health over an analysis window, from stored NVML samples (diagnosis input)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smon_server.store.models import GpuSample
from smon_server.store.queries import RankAgent
from smon_server.whatif.signals import GpuHealth

# NVML clock-event reasons that mean the GPU slowed itself down (not idle / app clocks).
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # SW power cap, HW slowdown, SW/HW thermal, brake


def gpu_health(samples: Sequence[GpuSample], agents: Sequence[RankAgent]) -> dict[int, GpuHealth]:
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
