"""Check an agent's batch record by record: keep the valid rows, name what is wrong with the rest.

Bad input never takes good input down with it: one NaN duration rejects that step record only,
with a machine-readable reason the agent sees in its Ack and the server counts in metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import unknown_fields
from google.protobuf.message import Message

from smon.v1 import ingest_pb2 as pb
from smon_server.columns import spans_from_phases
from smon_server.store import codec
from smon_server.store.rows import ValidBatch

# Reasons (stable strings: they appear in Acks and in smon_ingest_rejected_total{reason}).
MISSING_AGENT_ID = "missing_agent_id"
MISSING_SEQ = "missing_seq"
MISSING_JOB = "missing_job"
BAD_COORDINATES = "bad_coordinates"
BAD_CLOCK_OFFSET = "bad_clock_offset"
BATCH_TOO_LARGE = "batch_too_large"
NEGATIVE_STEP = "negative_step"
NON_FINITE = "non_finite"
NEGATIVE_DURATION = "negative_duration"
ABSURD_DURATION = "absurd_duration"
END_BEFORE_START = "end_before_start"
BAD_TIME = "bad_time"
TOO_MANY_SPANS = "too_many_spans"
BAD_NAME = "bad_name"
DUPLICATE_STEP = "duplicate_step"
NEGATIVE_VALUE = "negative_value"
BAD_SPAN = "bad_span"  # a micro-batch or chunk number outside what a stored span holds

MAX_NAME_LENGTH = 128
MAX_JOB_LENGTH = 256
MAX_CLOCK_OFFSET = 365 * 86_400.0
# Wall-clock slack for start <= end across two clock reads on the agent.
_TIME_SLACK = 1e-3


@dataclass(frozen=True)
class Limits:
    max_batch_records: int = 10_000
    max_spans_per_step: int = 4096
    max_duration_seconds: float = 86_400.0


class BatchRejected(Exception):
    """The batch as a whole cannot be stored (no job, no identity): nothing in it is kept."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def validate_batch(batch: pb.Batch, limits: Limits) -> ValidBatch:
    """Split a batch into storable rows (times shifted to the server clock) and rejections."""
    coords = batch.coords
    if not batch.agent_id or len(batch.agent_id) > 64:
        raise BatchRejected(MISSING_AGENT_ID, "agent_id must be 1-64 characters")
    if batch.seq == 0:
        raise BatchRejected(MISSING_SEQ, "seq must start at 1")
    if not coords.job or len(coords.job) > MAX_JOB_LENGTH:
        raise BatchRejected(MISSING_JOB, f"coords.job must be 1-{MAX_JOB_LENGTH} characters")
    if coords.rank < 0 or coords.world_size < 1 or coords.rank >= coords.world_size:
        raise BatchRejected(
            BAD_COORDINATES, f"rank {coords.rank} is not within world_size {coords.world_size}"
        )
    if min(coords.dp_rank, coords.pp_rank, coords.tp_rank) < 0:
        raise BatchRejected(BAD_COORDINATES, "dp/pp/tp ranks must be >= 0")
    offset = batch.clock_offset
    if not math.isfinite(offset) or abs(offset) > MAX_CLOCK_OFFSET:
        raise BatchRejected(BAD_CLOCK_OFFSET, f"clock_offset {offset!r} is not a plausible offset")

    out = ValidBatch(
        agent_id=batch.agent_id,
        seq=batch.seq,
        job_id=coords.job,
        coords=coords,
        clock_offset=offset,
        final=batch.final,
        heartbeat=batch.heartbeat if batch.HasField("heartbeat") else None,
        counters=batch.counters if batch.HasField("counters") else None,
    )
    out.unknown_fields = _count_unknown(batch)

    budget = limits.max_batch_records
    seen_steps: set[int] = set()
    for index, record in enumerate(batch.steps):
        if budget <= 0:
            out.rejections.append(_reject("step", index, BATCH_TOO_LARGE, "over max_batch_records"))
            continue
        reason = _check_step(record, limits) or (DUPLICATE_STEP if record.step in seen_steps else None)
        if reason is not None:
            out.rejections.append(_reject("step", index, reason, f"step {record.step}"))
            continue
        budget -= 1
        seen_steps.add(record.step)
        out.unknown_fields += _count_unknown(record)
        out.steps.append(_step_row(record, out, offset))
    for index, sample in enumerate(batch.gpu_samples):
        if budget <= 0:
            out.rejections.append(_reject("gpu_sample", index, BATCH_TOO_LARGE, "over max_batch_records"))
            continue
        reason = _check_gpu_sample(sample)
        if reason is not None:
            out.rejections.append(_reject("gpu_sample", index, reason, f"gpu {sample.gpu_index}"))
            continue
        budget -= 1
        out.gpu_samples.append(_gpu_row(sample, out, offset))
    if out.heartbeat is not None and not math.isfinite(out.heartbeat.time):
        out.rejections.append(_reject("heartbeat", 0, NON_FINITE, "heartbeat time"))
        out.heartbeat = None
    return out


def _reject(kind: str, index: int, reason: str, detail: str) -> pb.Rejection:
    return pb.Rejection(kind=kind, index=index, reason=reason, detail=detail)


def _count_unknown(message: Message) -> int:
    return len(unknown_fields.UnknownFieldSet(message))


def _check_step(record: pb.StepRecord, limits: Limits) -> str | None:
    if record.step < 0:
        return NEGATIVE_STEP
    numbers = [record.start_time, record.end_time, record.duration, record.gc_seconds]
    numbers.extend(record.phases.values())
    for span in record.spans:
        numbers.append(span.start)
        numbers.append(span.duration)
    if not all(math.isfinite(x) for x in numbers):
        return NON_FINITE
    if record.start_time <= 0 or record.end_time <= 0:
        return BAD_TIME
    if record.end_time + _TIME_SLACK < record.start_time:
        return END_BEFORE_START
    durations = [record.duration, record.gc_seconds, *record.phases.values()]
    durations.extend(span.duration for span in record.spans)
    if min(durations) < 0:
        return NEGATIVE_DURATION
    if max(durations) > limits.max_duration_seconds:
        return ABSURD_DURATION
    if len(record.spans) > limits.max_spans_per_step:
        return TOO_MANY_SPANS
    names = [*record.phases.keys(), *(span.kind for span in record.spans)]
    if any(not name or len(name) > MAX_NAME_LENGTH or "\x00" in name for name in names):
        return BAD_NAME
    for span in record.spans:
        if not (-1 <= span.microbatch <= codec.MAX_MICROBATCH and 0 <= span.chunk <= codec.MAX_CHUNK):
            return BAD_SPAN
    if any(not -32768 <= m.microbatch <= codec.MAX_MICROBATCH for m in record.microbatch_seq):
        return BAD_SPAN
    if not math.isfinite(record.seq.sum_sq) or record.seq.sum_sq < 0:
        return NON_FINITE
    return None


def _step_row(record: pb.StepRecord, batch: ValidBatch, offset: float) -> dict[str, Any]:
    """The record as store/writes.py takes it: spans relative to the step's start (compact, and
    independent of clock offsets) in start order, an enclosing span before those it contains."""
    start = record.start_time
    spans = [
        (s.kind, s.start - start, s.duration, s.microbatch if s.HasField("microbatch") else -1, s.chunk)
        for s in record.spans
    ] or spans_from_phases(record.phases)
    spans.sort(key=lambda s: (s[1], -s[2]))
    seq = record.seq
    return {
        "rank": batch.coords.rank,
        "step": record.step,
        "start_time": start + offset,
        "duration": record.duration,
        "gc_count": min(record.gc_count, codec.MAX_GC_COUNT),
        "gc_seconds": record.gc_seconds,
        "spans": spans,
        "seq_total": (seq.count, seq.max_len, seq.tokens, seq.sum_sq) if seq.count else None,
        "seq_microbatches": [
            (m.microbatch, m.seq.count, m.seq.max_len, m.seq.tokens, m.seq.sum_sq)
            for m in record.microbatch_seq
        ],
    }


_GPU_FLOAT_FIELDS = (
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "mem_clock_max_mhz",
    "gpu_util",
    "mem_util",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
)
_GPU_INT_FIELDS = ("throttle_reasons", "ecc_corrected", "ecc_uncorrected", "pcie_replay")


def _check_gpu_sample(sample: pb.GpuSample) -> str | None:
    if not math.isfinite(sample.time) or sample.time <= 0:
        return BAD_TIME
    for name in _GPU_FLOAT_FIELDS:
        if sample.HasField(name):
            value = getattr(sample, name)
            if not math.isfinite(value):
                return NON_FINITE
            if value < 0 and name != "temperature_c":
                return NEGATIVE_VALUE
    return None


def _gpu_row(sample: pb.GpuSample, batch: ValidBatch, offset: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "job_id": batch.job_id,
        "rank": batch.coords.rank,
        "gpu_index": sample.gpu_index,
        "time": sample.time + offset,
        "gpu_uuid": sample.gpu_uuid or batch.coords.gpu_uuid,
        "xid_events": list(sample.xid_events),
    }
    for name in (*_GPU_FLOAT_FIELDS, *_GPU_INT_FIELDS):
        row[name] = getattr(sample, name) if sample.HasField(name) else None
    return row
