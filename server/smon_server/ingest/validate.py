"""Check an agent's batch record by record: keep the valid rows, name what is wrong with the rest.

Bad input never takes good input down with it: one NaN duration rejects that step record only,
with a machine-readable reason the agent sees in its Ack and the server counts in metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import unknown_fields
from google.protobuf.message import Message

from smon.v1 import ingest_pb2 as pb
from smon_server.columns import spans_from_phases
from smon_server.store import codec
from smon_server.store.rows import StepBlock, ValidBatch

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

# Strings of the coordinates and the columns they are stored in (store/models.py Agent).
COORDINATE_STRINGS = {"host": 256, "gpu_uuid": 128, "agent_version": 64}  # backend: cut to 32
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
    for name, limit in COORDINATE_STRINGS.items():
        value = getattr(coords, name)
        if len(value) > limit or "\x00" in value:
            raise BatchRejected(BAD_COORDINATES, f"coords.{name} must be at most {limit} characters, no NUL")
    if "\x00" in coords.job or "\x00" in batch.agent_id:
        raise BatchRejected(MISSING_JOB, "job and agent_id must not contain NUL")
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

    out.steps, rejected = _step_block(batch.steps, limits, offset)
    out.rejections.extend(rejected)
    out.unknown_fields += sum(_count_unknown(record) for record in batch.steps)
    budget = limits.max_batch_records - len(out.steps)
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


def _step_block(
    records: Sequence[pb.StepRecord], limits: Limits, offset: float
) -> tuple[StepBlock, list[pb.Rejection]]:
    """The valid records as columns, and a rejection for each other one.

    Every check runs on whole columns; a record gets the first reason that applies, in the order
    below, then records past the batch's budget and repeats of a step already kept are refused."""
    n = len(records)
    if n == 0:
        return StepBlock.empty(), []
    step = np.array([r.step for r in records], dtype=np.int64)
    start = np.array([r.start_time for r in records], dtype=np.float64)
    end = np.array([r.end_time for r in records], dtype=np.float64)
    duration = np.array([r.duration for r in records], dtype=np.float64)
    gc_seconds = np.array([r.gc_seconds for r in records], dtype=np.float64)
    span_lists = [r.spans for r in records]
    spans = [s for listed in span_lists for s in listed]
    span_count = np.array([len(listed) for listed in span_lists], dtype=np.int64)
    span_record = np.repeat(np.arange(n), span_count)
    s_start = np.array([s.start for s in spans], dtype=np.float64)
    s_duration = np.array([s.duration for s in spans], dtype=np.float64)
    s_microbatch = np.array([s.microbatch if s.HasField("microbatch") else -1 for s in spans], dtype=np.int64)
    s_chunk = np.array([s.chunk for s in spans], dtype=np.int64)
    s_kinds = [s.kind for s in spans]
    phase_maps = [r.phases for r in records]
    phase_names = [k for p in phase_maps for k in p]  # iterating the map itself stays in C
    phase_record = np.repeat(np.arange(n), [len(p) for p in phase_maps])
    p_values = np.array([p[k] for p in phase_maps for k in p], dtype=np.float64)
    # A sub-message is a new Python object on every access: touch `seq` only where it is set.
    seqs = {i: r.seq for i, r in enumerate(records) if r.HasField("seq")}
    sum_sq = np.zeros(n, dtype=np.float64)
    sum_sq[list(seqs)] = [q.sum_sq for q in seqs.values()]

    def any_per_record(flags: np.ndarray, owner: np.ndarray) -> np.ndarray:
        return np.bincount(owner[flags], minlength=n) > 0

    names = set(s_kinds).union(phase_names)
    bad_names = {x for x in names if not x or len(x) > MAX_NAME_LENGTH or "\x00" in x}
    all_finite = np.isfinite(start) & np.isfinite(end) & np.isfinite(duration) & np.isfinite(gc_seconds)
    negative = (duration < 0) | (gc_seconds < 0)
    absurd = (duration > limits.max_duration_seconds) | (gc_seconds > limits.max_duration_seconds)
    for values, owner in ((p_values, phase_record), (s_start, span_record), (s_duration, span_record)):
        all_finite &= ~any_per_record(~np.isfinite(values), owner)
    for values, owner in ((p_values, phase_record), (s_duration, span_record)):
        negative |= any_per_record(values < 0, owner)
        absurd |= any_per_record(values > limits.max_duration_seconds, owner)
    bad_span = any_per_record(
        (s_microbatch < -1)
        | (s_microbatch > codec.MAX_MICROBATCH)
        | (s_chunk < 0)
        | (s_chunk > codec.MAX_CHUNK),
        span_record,
    )
    microbatch_seq: list[list[pb.MicroBatchSequences]] = [[] for _ in range(n)]
    for i, record in enumerate(records):
        if len(record.microbatch_seq):
            microbatch_seq[i] = list(record.microbatch_seq)
            bad_span[i] |= any(not -32768 <= m.microbatch <= codec.MAX_MICROBATCH for m in microbatch_seq[i])
    bad_name = np.zeros(n, dtype=bool)
    if bad_names:
        bad_name |= any_per_record(np.array([k in bad_names for k in s_kinds], dtype=bool), span_record)
        bad_name |= any_per_record(np.array([k in bad_names for k in phase_names], dtype=bool), phase_record)

    checks = (
        (step < 0, NEGATIVE_STEP),
        (~all_finite, NON_FINITE),
        (np.nan_to_num(start) <= 0, BAD_TIME),
        (np.nan_to_num(end) <= 0, BAD_TIME),
        (end + _TIME_SLACK < start, END_BEFORE_START),
        (negative, NEGATIVE_DURATION),
        (absurd, ABSURD_DURATION),
        (span_count > limits.max_spans_per_step, TOO_MANY_SPANS),
        (bad_name, BAD_NAME),
        (bad_span, BAD_SPAN),
        (~np.isfinite(sum_sq) | (sum_sq < 0), NON_FINITE),
    )
    reason: list[str | None] = [None] * n
    failed = np.zeros(n, dtype=bool)
    for flags, name in checks:
        for i in np.flatnonzero(flags & ~failed).tolist():
            reason[i] = name
        failed |= flags
    # In record order: a valid record is kept while the budget lasts and its step is new.
    kept_steps: set[int] = set()
    budget = limits.max_batch_records
    keep = np.zeros(n, dtype=bool)
    rejections = []
    for i, s in enumerate(step.tolist()):
        why = BATCH_TOO_LARGE if budget <= 0 else reason[i] or (DUPLICATE_STEP if s in kept_steps else None)
        if why is not None:
            detail = "over max_batch_records" if why == BATCH_TOO_LARGE else f"step {s}"
            rejections.append(_reject("step", i, why, detail))
            continue
        keep[i] = True
        kept_steps.add(s)
        budget -= 1

    # Records with phase totals but no spans get their phases laid end to end as spans.
    kind_index = {k: i for i, k in enumerate(dict.fromkeys(s_kinds))}
    kind = list(map(kind_index.__getitem__, s_kinds))
    rel_start = s_start - start[span_record]
    extra = [
        (i, kind_index.setdefault(k, len(kind_index)), a, d)
        for i in np.flatnonzero(keep & (span_count == 0)).tolist()
        for k, a, d, _, _ in spans_from_phases(phase_maps[i])
    ]
    if extra:
        e_record, e_kind, e_start, e_duration = (np.array(c) for c in zip(*extra, strict=True))
        span_record = np.r_[span_record, e_record.astype(np.int64)]
        kind += e_kind.tolist()
        rel_start = np.r_[rel_start, e_start.astype(np.float64)]
        s_duration = np.r_[s_duration, e_duration.astype(np.float64)]
        s_microbatch = np.r_[s_microbatch, np.full(len(extra), -1, np.int64)]
        s_chunk = np.r_[s_chunk, np.zeros(len(extra), np.int64)]
    span_keep = keep[span_record]
    order = np.lexsort((-s_duration, rel_start, span_record))  # an enclosing span before its contents
    order = order[span_keep[order]]
    kept_records = np.flatnonzero(keep).tolist()
    block = StepBlock(
        step=step[keep],
        start_time=start[keep] + offset,
        duration=duration[keep],
        gc_count=np.minimum([r.gc_count for r in records], codec.MAX_GC_COUNT).astype(np.int64)[keep],
        gc_seconds=gc_seconds[keep],
        span_offsets=np.r_[0, np.cumsum(np.bincount(span_record[order], minlength=n)[keep])].astype(np.int64),
        kind_names=tuple(kind_index),
        span_kind=np.asarray(kind, dtype=np.int64)[order],
        span_start=rel_start[order],
        span_duration=s_duration[order],
        span_microbatch=s_microbatch[order],
        span_chunk=s_chunk[order],
        seq_total=[
            codec.pack_seq_total((q.count, q.max_len, q.tokens, q.sum_sq))
            if q is not None and q.count
            else None
            for q in (seqs.get(i) for i in kept_records)
        ],
        seq_microbatches=[
            codec.pack_seq_microbatches(
                [
                    (m.microbatch, m.seq.count, m.seq.max_len, m.seq.tokens, m.seq.sum_sq)
                    for m in microbatch_seq[i]
                ]
            )
            if microbatch_seq[i]
            else None
            for i in kept_records
        ],
    )
    return block, rejections


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
    if len(sample.gpu_uuid) > COORDINATE_STRINGS["gpu_uuid"] or "\x00" in sample.gpu_uuid:
        return BAD_NAME
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
