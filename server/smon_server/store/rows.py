"""Row types the store reads and writes: what ingest hands to `writes.py`, what `queries.py` returns.

They live here, not with their producers or consumers, so that the store depends on nothing above it:
not on the wire protocol either. Ingest translates each protobuf message into these (ingest/wire.py);
the per-record data is columns already (`StepBlock`), so the translation is per batch, not per record.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Coordinates:
    """Where an agent runs: its ranks, host, GPU and process (stored on its agent and job rows)."""

    rank: int
    world_size: int
    local_rank: int = 0
    host: str = ""
    gpu_uuid: str = ""
    dp_rank: int = 0
    pp_rank: int = 0
    tp_rank: int = 0
    dp_size: int = 0  # 0: not reported (the world size is used)
    pp_size: int = 0
    tp_size: int = 0
    pid: int = 0
    agent_version: str = ""
    backend: str = ""
    # The attempt identity the agent reported (a launcher's restart count), None if it said none.
    attempt: int | None = None


@dataclass(frozen=True)
class Heartbeat:
    """An agent's latest sign of life, times on the agent's clock."""

    time: float
    last_step: int
    current_step: int
    phase: str
    phase_since: float  # 0: no phase open


@dataclass(frozen=True)
class AgentCounters:
    """An agent's cumulative counters the store keeps (the largest seen wins)."""

    dropped_records: int
    errors: int


@dataclass(frozen=True)
class Rejection:
    """A record (or the whole batch, index -1) refused, and why: the agent reads it in its Ack."""

    kind: str
    index: int
    reason: str
    detail: str


@dataclass(frozen=True)
class StepBlock:
    """A batch's valid step records as columns, one numpy array per field (ingest/validate.py
    builds it, store/writes.py writes it), so a batch of a hundred records costs a few dozen array
    operations instead of a Python object per record and span."""

    step: np.ndarray  # int64 [records]
    start_time: np.ndarray  # float64: Unix seconds on the server's clock
    duration: np.ndarray  # float64 seconds
    gc_count: np.ndarray  # int64, clipped to what the stored column holds
    gc_seconds: np.ndarray  # float64
    span_offsets: np.ndarray  # int64 [records + 1]: record i's spans are [offsets[i], offsets[i + 1])
    kind_names: tuple[str, ...]  # the span kinds this block uses
    span_kind: np.ndarray  # int64 [spans]: index into kind_names
    span_start: np.ndarray  # float64: seconds from the record's start; in start order per record
    span_duration: np.ndarray  # float64
    span_microbatch: np.ndarray  # int64, -1 when not per micro-batch
    span_chunk: np.ndarray  # int64
    seq_total: list[bytes | None]  # packed per record (store/codec.py)
    seq_microbatches: list[bytes | None]
    # Device-timed records: their spans' host views, packed (codec.SPAN_HOST); None for the rest.
    span_host: list[bytes | None]

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @classmethod
    @functools.cache
    def empty(cls) -> StepBlock:
        """The block of no records: one shared, read-only instance (every batch starts with it,
        and building it was ~3.5% of a replica's GIL-held time at 1,600 rank batches a second)."""
        f8, i8, offsets = np.zeros(0, np.float64), np.zeros(0, np.int64), np.zeros(1, np.int64)
        for array in (f8, i8, offsets):
            array.flags.writeable = False
        return cls(
            step=i8, start_time=f8, duration=f8, gc_count=i8, gc_seconds=f8,
            span_offsets=offsets, kind_names=(), span_kind=i8, span_start=f8,
            span_duration=f8, span_microbatch=i8, span_chunk=i8, seq_total=[], seq_microbatches=[],
            span_host=[],
        )  # fmt: skip

    def take(self, keep: np.ndarray) -> StepBlock:
        """The records where the boolean mask `keep` is true, with their spans."""
        if bool(keep.all()):
            return self
        counts = np.diff(self.span_offsets)
        span_keep = np.repeat(keep, counts)
        per_record = {
            name: getattr(self, name)[keep]
            for name in ("step", "start_time", "duration", "gc_count", "gc_seconds")
        }
        per_span = {
            name: getattr(self, name)[span_keep]
            for name in ("span_kind", "span_start", "span_duration", "span_microbatch", "span_chunk")
        }
        rows = np.flatnonzero(keep).tolist()
        return replace(
            self,
            **per_record,
            **per_span,
            span_offsets=np.r_[0, np.cumsum(counts[keep])].astype(np.int64),
            seq_total=[self.seq_total[i] for i in rows],
            seq_microbatches=[self.seq_microbatches[i] for i in rows],
            span_host=[self.span_host[i] for i in rows],
        )

    def spans(self, record: int) -> list[tuple[str, float, float, int, int]]:
        """(kind, start from the record's start, duration, micro-batch, chunk) of one record."""
        lo, hi = int(self.span_offsets[record]), int(self.span_offsets[record + 1])
        return [
            (self.kind_names[k], s, d, m, c)
            for k, s, d, m, c in zip(
                self.span_kind[lo:hi].tolist(),
                self.span_start[lo:hi].tolist(),
                self.span_duration[lo:hi].tolist(),
                self.span_microbatch[lo:hi].tolist(),
                self.span_chunk[lo:hi].tolist(),
                strict=True,
            )
        ]


@dataclass
class ValidBatch:
    agent_id: str
    seq: int
    job_id: str
    coords: Coordinates
    clock_offset: float
    final: bool
    steps: StepBlock = field(default_factory=StepBlock.empty)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    heartbeat: Heartbeat | None = None
    counters: AgentCounters | None = None
    rejections: list[Rejection] = field(default_factory=list)
    unknown_fields: int = 0
    # The job attempt it is stored in, set as it is written (store/attempts.py).
    attempt: int = 1

    @property
    def reported_attempt(self) -> int | None:
        """The attempt identity the agent reported (a launcher's restart count), if any."""
        return self.coords.attempt

    @property
    def accepted(self) -> int:
        return len(self.steps) + len(self.gpu_samples)

    @property
    def digest(self) -> int:
        """A signed 64-bit digest of the records (not of the message bytes: protobuf does not
        promise one encoding, and the heartbeat and counters of a resend may differ)."""
        h = hashlib.blake2b(digest_size=8)
        b = self.steps
        for column in (b.step, b.start_time, b.duration, b.span_offsets, b.span_start, b.span_duration):
            h.update(np.ascontiguousarray(column).tobytes())
        # Each span's kind name, hashed as its index into the block's names plus the names once.
        h.update(np.ascontiguousarray(b.span_kind, dtype="<i8").tobytes())
        h.update("\x00".join(b.kind_names).encode())
        for sample in self.gpu_samples:
            h.update(repr((sample["gpu_index"], sample["time"])).encode())
        return int.from_bytes(h.digest(), "little", signed=True)
