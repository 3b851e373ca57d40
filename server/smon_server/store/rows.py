"""Row types the store reads and writes: what ingest hands to `writes.py`, what `queries.py` returns.

They live here, not with their producers or consumers, so that the store depends on nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import smon.v1.ingest_pb2 as pb


@dataclass
class ValidBatch:
    agent_id: str
    seq: int
    job_id: str
    coords: pb.Coordinates
    clock_offset: float
    final: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    heartbeat: pb.Heartbeat | None = None
    counters: pb.AgentCounters | None = None
    rejections: list[pb.Rejection] = field(default_factory=list)
    unknown_fields: int = 0

    @property
    def accepted(self) -> int:
        return len(self.steps) + len(self.gpu_samples)
