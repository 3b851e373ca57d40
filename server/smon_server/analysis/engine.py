"""Glue between the live server and the what-if engine (being finished: see whatif/diagnosis)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smon_server.analysis.liveness import Liveness
from smon_server.analysis.ops import OpTable


@dataclass(frozen=True)
class GpuHealth:
    samples: int
    throttled_fraction: float
    sm_clock_ratio: float | None
    ecc_uncorrected: int
    xid_events: int


@dataclass
class EngineOutput:
    summary: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    workers: dict[str, Any] = field(default_factory=dict)
    rank_slowdown: dict[str, Any] = field(default_factory=dict)
    rank_overall: dict[int, float] = field(default_factory=dict)


def run(
    ops: OpTable | None,
    *,
    gpus: int,
    elapsed_hours: float,
    hosts: dict[int, str],
    health: dict[int, GpuHealth],
    liveness: Liveness,
) -> EngineOutput:
    raise NotImplementedError("engine glue lands with the what-if engine")
