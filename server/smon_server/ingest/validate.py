"""Check an agent's batch record by record: keep the valid rows, name what is wrong with the rest.

Bad input never takes good input down with it: one NaN duration rejects that step record only,
with a machine-readable reason the agent sees in its Ack and the server counts in metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np
from google.protobuf import unknown_fields
from google.protobuf.message import Message

from smon.v1 import ingest_pb2 as pb
from smon_server.columns import dense_codes
from smon_server.ingest import record_columns, wire
from smon_server.ingest.record_columns import RecordColumns, good_name
from smon_server.store import codec
from smon_server.store.rows import Rejection, StepBlock, ValidBatch

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
BAD_TABLE = "bad_table"  # a StepTable whose columns do not fit together
OUT_OF_RANGE = "out_of_range"  # an integer past the column that stores it (GPU index, counters)

# Strings of the coordinates and the columns they are stored in (store/models.py Agent).
COORDINATE_STRINGS = {"host": 256, "gpu_uuid": 128, "agent_version": 64}  # backend: cut to 32
MAX_JOB_LENGTH = 256
MAX_CLOCK_OFFSET = 365 * 86_400.0
# Far past any job (tens of thousands of GPUs): the analysis sizes its grids by ranks.
MAX_WORLD_SIZE = 1 << 20
MAX_PHASE_LENGTH = 128  # Agent.hb_phase
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
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
    out, table_refused = _shell(batch, limits)
    offset = out.clock_offset
    columns = record_columns.from_rows(batch.steps)
    if table_refused:  # the records sent as messages beside it are still taken
        detail = f"{batch.step_table.records} records declared, more than twice max_batch_records"
        out.rejections.append(_reject("step_table", -1, BAD_TABLE, detail))
    elif batch.HasField("step_table"):
        try:
            columns = RecordColumns.concat(columns, record_columns.from_table(batch.step_table))
        except record_columns.MalformedTable as exc:  # one refusal for the table, not one per record
            detail = f"{batch.step_table.records} records refused: {exc}"
            out.rejections.append(_reject("step_table", -1, BAD_TABLE, detail))
    out.steps, rejected = _step_block(columns, limits, offset)
    out.rejections.extend(rejected)
    _finish(out, batch, limits)
    return out


def validate_parts(batches: list[pb.Batch], limits: Limits) -> list[ValidBatch | BatchRejected]:
    """validate_batch of each of a host's batches (ingest/service.py, StreamHost), with the
    StepTables of those that fit together (records only as a table, the same span kinds and
    optional columns, each table's columns of consistent lengths) checked as one set of columns:
    the numpy set-up a batch's checks cost (~150-250 µs, most of a small batch's validation) is
    then paid once per host message instead of once per rank. The outcome of each batch is what
    validate_batch gives it; a batch that does not fit is validated alone."""
    out: list[ValidBatch | BatchRejected | None] = [None] * len(batches)
    groups: dict[tuple[object, ...], list[int]] = {}
    for index, batch in enumerate(batches):
        key = _merge_key(batch, limits)
        if key is None:
            out[index] = _validate_or_refusal(batch, limits)
        else:
            groups.setdefault(key, []).append(index)
    for indexes in groups.values():
        shells: list[tuple[int, ValidBatch]] = []
        for index in indexes:
            try:
                shells.append((index, _shell(batches[index], limits)[0]))
            except BatchRejected as rejected:
                out[index] = rejected
        if len(shells) < 2:
            for index, _ in shells:
                out[index] = _validate_or_refusal(batches[index], limits)
            continue
        tables = [batches[i].step_table for i, _ in shells]
        columns = record_columns.from_table(_merged(tables))  # each table checked in _merge_key
        counts = np.array([t.records for t in tables], dtype=np.int64)
        part = np.repeat(np.arange(len(shells), dtype=np.int64), counts)
        offsets = np.array([v.clock_offset for _, v in shells], dtype=np.float64)[part]
        block, refused = _step_block(columns, limits, offsets, part=part)
        starts = np.r_[0, np.cumsum(counts)[:-1]]
        kept = counts.copy()  # every record not kept has one rejection
        for rejection in refused:  # indexes within the merged columns -> within each batch
            owner = int(part[rejection.index])
            kept[owner] -= 1
            shells[owner][1].rejections.append(replace(rejection, index=rejection.index - int(starts[owner])))
        for (index, valid), steps in zip(shells, _split(block, kept), strict=True):
            valid.steps = steps
            _finish(valid, batches[index], limits)
            out[index] = valid
    return [o if o is not None else BatchRejected(MISSING_AGENT_ID, "not validated") for o in out]


def _validate_or_refusal(batch: pb.Batch, limits: Limits) -> ValidBatch | BatchRejected:
    try:
        return validate_batch(batch, limits)
    except BatchRejected as rejected:
        return rejected


_PER_RECORD = {
    "step": 8, "start_time": 8, "end_time": 8, "duration": 8, "gc_count": 4, "gc_seconds": 8,
    "span_count": 4,
}  # fmt: skip
_PER_SPAN = {"span_kind": 2, "span_start": 8, "span_duration": 8}
_OPTIONAL_PER_SPAN = {"span_microbatch": 4, "span_chunk": 4, "span_host_duration": 8, "span_host_start": 8}
_OPTIONAL_PER_RECORD = {"seq_count": 4, "seq_tokens": 8, "seq_sum_sq": 8, "seq_max_len": 4}


def _merge_key(batch: pb.Batch, limits: Limits) -> tuple[object, ...] | None:
    """What a batch's StepTable must share with others to be checked in one set of columns (its
    kinds, its optional columns, its job), or None: it is validated alone (records as messages,
    micro-batch rows, a table whose columns do not fit together, which then gets its refusal)."""
    table = batch.step_table
    n = table.records
    if batch.steps or not batch.HasField("step_table") or not 0 < n <= 2 * limits.max_batch_records:
        return None
    if table.mb_rows or any(len(getattr(table, name)) != n * size for name, size in _PER_RECORD.items()):
        return None
    m = int(np.frombuffer(table.span_count, dtype="<u4").sum())
    if any(len(getattr(table, name)) != m * size for name, size in _PER_SPAN.items()):
        return None
    present = []
    for columns, count in ((_OPTIONAL_PER_SPAN, m), (_OPTIONAL_PER_RECORD, n)):
        for name, size in columns.items():
            raw = getattr(table, name)
            if raw and len(raw) != count * size:
                return None
            present.append(bool(raw))
    return (batch.coords.job, tuple(table.kinds), tuple(present))


def _merged(tables: list[pb.StepTable]) -> pb.StepTable:
    """One StepTable of the given ones' records in order (they share kinds and columns)."""
    out = pb.StepTable(records=sum(t.records for t in tables), kinds=tables[0].kinds)
    for name in (*_PER_RECORD, *_PER_SPAN, *_OPTIONAL_PER_SPAN, *_OPTIONAL_PER_RECORD):
        if getattr(tables[0], name):
            setattr(out, name, b"".join(getattr(t, name) for t in tables))
    return out


def _split(block: StepBlock, counts: np.ndarray) -> list[StepBlock]:
    """The merged block cut back into each batch's records (`counts`: kept records of each)."""
    bounds = np.r_[0, np.cumsum(counts)].tolist()
    so = block.span_offsets
    out = []
    for lo, hi in pairwise(bounds):
        s_lo, s_hi = int(so[lo]), int(so[hi])
        out.append(
            StepBlock(
                step=block.step[lo:hi],
                start_time=block.start_time[lo:hi],
                duration=block.duration[lo:hi],
                gc_count=block.gc_count[lo:hi],
                gc_seconds=block.gc_seconds[lo:hi],
                span_offsets=so[lo : hi + 1] - s_lo,
                kind_names=block.kind_names,
                span_kind=block.span_kind[s_lo:s_hi],
                span_start=block.span_start[s_lo:s_hi],
                span_duration=block.span_duration[s_lo:s_hi],
                span_microbatch=block.span_microbatch[s_lo:s_hi],
                span_chunk=block.span_chunk[s_lo:s_hi],
                seq_total=block.seq_total[lo:hi],
                seq_microbatches=block.seq_microbatches[lo:hi],
                span_host=block.span_host[lo:hi],
            )
        )
    return out


def _shell(batch: pb.Batch, limits: Limits) -> tuple[ValidBatch, bool]:
    """The batch's identity and per-batch fields checked, no records yet; and whether its
    StepTable declares more records than may be read at all."""
    coords = batch.coords
    if not batch.agent_id or len(batch.agent_id) > 64:
        raise BatchRejected(MISSING_AGENT_ID, "agent_id must be 1-64 characters")
    if batch.seq == 0:
        raise BatchRejected(MISSING_SEQ, "seq must start at 1")
    if not coords.job or len(coords.job) > MAX_JOB_LENGTH:
        raise BatchRejected(MISSING_JOB, f"coords.job must be 1-{MAX_JOB_LENGTH} characters")
    _check_coordinates(coords)
    if "\x00" in coords.job or "\x00" in batch.agent_id:
        raise BatchRejected(MISSING_JOB, "job and agent_id must not contain NUL")
    offset = batch.clock_offset
    if not math.isfinite(offset) or abs(offset) > MAX_CLOCK_OFFSET:
        raise BatchRejected(BAD_CLOCK_OFFSET, f"clock_offset {offset!r} is not a plausible offset")
    # Declared counts are checked before anything is built from them: a StepTable saying it holds
    # four billion records must cost one comparison, not a rejection per record.
    table_refused = batch.step_table.records > 2 * limits.max_batch_records
    declared = len(batch.steps) + len(batch.gpu_samples) + (0 if table_refused else batch.step_table.records)
    if declared > 2 * limits.max_batch_records:
        raise BatchRejected(
            BATCH_TOO_LARGE,
            f"{declared} records, more than twice max_batch_records ({limits.max_batch_records})",
        )
    out = ValidBatch(
        agent_id=batch.agent_id,
        seq=batch.seq,
        job_id=coords.job,
        coords=wire.coordinates(coords),
        clock_offset=offset,
        final=batch.final,
        counters=wire.counters(batch.counters) if batch.HasField("counters") else None,
    )
    out.unknown_fields = _count_unknown(batch)
    return out, table_refused


def _finish(out: ValidBatch, batch: pb.Batch, limits: Limits) -> None:
    """The GPU samples and the heartbeat, once the step records are taken."""
    offset = out.clock_offset
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
    if batch.HasField("heartbeat"):
        reason = _check_heartbeat(batch.heartbeat)
        if reason is None:
            out.heartbeat = wire.heartbeat(batch.heartbeat)
        else:
            out.rejections.append(_reject("heartbeat", 0, reason, "heartbeat time, phase or phase_since"))


def _check_coordinates(coords: pb.Coordinates) -> None:
    """Ranks and sizes within the world (the analysis sizes its grids by them); strings that fit
    their columns (no NUL: PostgreSQL's text cannot hold it)."""
    world = coords.world_size
    if not 1 <= world <= MAX_WORLD_SIZE or not 0 <= coords.rank < world:
        raise BatchRejected(
            BAD_COORDINATES, f"rank {coords.rank} is not within world_size {world} (at most {MAX_WORLD_SIZE})"
        )
    for axis in ("dp", "pp", "tp"):
        rank, size = getattr(coords, f"{axis}_rank"), getattr(coords, f"{axis}_size")
        if not 0 <= rank < world or not 0 <= size <= world:
            raise BatchRejected(
                BAD_COORDINATES, f"{axis}_rank {rank} / {axis}_size {size} are not within world_size {world}"
            )
    for name, limit in COORDINATE_STRINGS.items():
        value = getattr(coords, name)
        if len(value) > limit or "\x00" in value:
            raise BatchRejected(BAD_COORDINATES, f"coords.{name} must be at most {limit} characters, no NUL")
    if "\x00" in coords.backend:
        raise BatchRejected(BAD_COORDINATES, "coords.backend must not contain NUL")


def _check_heartbeat(hb: pb.Heartbeat) -> str | None:
    if not math.isfinite(hb.time) or not math.isfinite(hb.phase_since):
        return NON_FINITE
    if len(hb.phase) > MAX_PHASE_LENGTH or "\x00" in hb.phase:
        return BAD_NAME
    return None


def _reject(kind: str, index: int, reason: str, detail: str) -> Rejection:
    return Rejection(kind=kind, index=index, reason=reason, detail=detail)


def _count_unknown(message: Message) -> int:
    return len(unknown_fields.UnknownFieldSet(message))


def _step_block(
    cols: RecordColumns, limits: Limits, offset: float | np.ndarray, *, part: np.ndarray | None = None
) -> tuple[StepBlock, list[Rejection]]:
    """The valid records as columns, and a rejection for each other one.

    Every check runs on whole columns; a record gets the first reason that applies, in the order
    below, then records past the batch's budget and repeats of a step already kept are refused.
    `part` (validate_parts): the batch of each record, the batches' records one after another;
    the budget and the repeats then count within each batch, and `offset` is per record."""
    n = len(cols)
    if n == 0:
        return StepBlock.empty(), []
    step, start, end, duration, gc_seconds = cols.step, cols.start, cols.end, cols.duration, cols.gc_seconds
    span_record = cols.span_record

    limit = limits.max_duration_seconds
    # Span flags first; most batches have none, and then no span needs to be traced to its record
    # (a bincount per flag: a sizeable share of a small batch's cost).
    span_non_finite = ~(np.isfinite(cols.span_start) & np.isfinite(cols.span_duration))
    span_negative = cols.span_duration < 0
    span_absurd = (cols.span_duration > limit) | (np.abs(cols.span_start) > limit)
    span_bad = (
        (cols.span_microbatch < -1)
        | (cols.span_microbatch > codec.MAX_MICROBATCH)
        | (cols.span_chunk < 0)
        | (cols.span_chunk > codec.MAX_CHUNK)
    )
    bad_kind = np.array([not good_name(k) for k in cols.kinds], dtype=bool)
    span_bad_name = bad_kind[cols.span_kind]
    if (span_non_finite | span_negative | span_absurd | span_bad | span_bad_name).any():

        def any_per_record(flags: np.ndarray) -> np.ndarray:
            return np.bincount(span_record[flags], minlength=n) > 0

    else:
        clean = np.zeros(n, dtype=bool)

        def any_per_record(flags: np.ndarray) -> np.ndarray:
            return clean

    all_finite = np.isfinite(start) & np.isfinite(end) & np.isfinite(duration) & np.isfinite(gc_seconds)
    all_finite &= ~cols.non_finite
    all_finite &= ~any_per_record(span_non_finite)
    negative = (duration < 0) | (gc_seconds < 0) | cols.negative | any_per_record(span_negative)
    absurd = (duration > limit) | (gc_seconds > limit) | (cols.over > limit) | any_per_record(span_absurd)
    bad_span = cols.bad_span | any_per_record(span_bad)
    bad_name = cols.bad_name | any_per_record(span_bad_name)
    sum_sq = cols.sum_sq

    checks = (
        (step < 0, NEGATIVE_STEP),
        (~all_finite, NON_FINITE),
        (~(start > 0), BAD_TIME),  # NaN too (it fails every comparison)
        (~(end > 0), BAD_TIME),
        (end + _TIME_SLACK < start, END_BEFORE_START),
        (negative, NEGATIVE_DURATION),
        (absurd, ABSURD_DURATION),
        (cols.span_count > limits.max_spans_per_step, TOO_MANY_SPANS),
        (bad_name, BAD_NAME),
        (bad_span, BAD_SPAN),
        (~np.isfinite(sum_sq) | (sum_sq < 0), NON_FINITE),
    )
    reason: list[str | None] = [None] * n
    failed = np.logical_or.reduce([flags for flags, _ in checks])
    if failed.any():  # name the first reason of each failed record (most batches have none)
        failed = np.zeros(n, dtype=bool)
        for flags, name in checks:
            for i in np.flatnonzero(flags & ~failed).tolist():
                reason[i] = name
            failed |= flags
    # In record order: a valid record is kept while the budget lasts and its step is new (the
    # first valid record of a step is kept; np.unique's index is the first occurrence).
    valid = np.flatnonzero(~failed)
    first_ok = np.zeros(n, dtype=bool)
    valid_steps = step[valid]
    ascending = valid_steps[1:] > valid_steps[:-1]
    if part is not None:
        valid_part = part[valid]
        ascending |= valid_part[1:] != valid_part[:-1]
    if bool(ascending.all()):  # ascending, as agents send them: all new
        first_ok[valid] = True
    elif part is None:
        first_ok[valid[np.unique(valid_steps, return_index=True)[1]]] = True
    else:  # the first of each (batch, step), in record order (lexsort is stable)
        order = np.lexsort((valid_steps, valid_part))
        sp, ss = valid_part[order], valid_steps[order]
        first = np.ones(order.size, dtype=bool)
        first[1:] = (sp[1:] != sp[:-1]) | (ss[1:] != ss[:-1])
        first_ok[valid[order[first]]] = True
    taken = np.cumsum(first_ok)
    if part is not None:  # counted from each batch's first record
        starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]])
        before = (taken - first_ok)[starts]
        taken = taken - np.repeat(before, np.diff(np.r_[starts, n]))
    keep = first_ok & (taken <= limits.max_batch_records)
    rejections = []
    for i in np.flatnonzero(~keep).tolist():
        why = reason[i]
        if why is not None:
            rejections.append(_reject("step", i, why, f"step {int(step[i])}"))
        elif first_ok[i]:
            rejections.append(_reject("step", i, BATCH_TOO_LARGE, "over max_batch_records"))
        else:
            rejections.append(_reject("step", i, DUPLICATE_STEP, f"step {int(step[i])}"))

    span_keep = keep[span_record]
    rel_start, s_duration = cols.span_start, cols.span_duration
    if _in_span_order(span_record, rel_start, s_duration):  # as the agent sends them: no sort
        order = np.flatnonzero(span_keep)
    else:
        order = np.lexsort((-s_duration, rel_start, span_record))  # an enclosing span before its contents
        order = order[span_keep[order]]
    kept_records = np.flatnonzero(keep).tolist()
    # Only the kinds of kept spans are named to the store: a refused record's kind (too long, a
    # NUL) must not reach the kind dictionary, whose column would refuse the whole group.
    used, span_kind = dense_codes(cols.span_kind[order], len(cols.kinds))
    span_host = _span_host(cols, order, span_record[order], kept_records)
    block = StepBlock(
        step=step[keep],
        start_time=start[keep] + (offset[keep] if isinstance(offset, np.ndarray) else offset),
        duration=duration[keep],
        gc_count=np.minimum(cols.gc_count, codec.MAX_GC_COUNT).astype(np.int64)[keep],
        gc_seconds=gc_seconds[keep],
        span_offsets=_offsets(np.bincount(span_record[order], minlength=n)[keep]),
        kind_names=tuple(cols.kinds[i] for i in used.tolist()),
        span_kind=span_kind.astype(np.int64),
        span_start=rel_start[order],
        span_duration=s_duration[order],
        span_microbatch=cols.span_microbatch[order],
        span_chunk=cols.span_chunk[order],
        # Most records carry no sequence statistics: skip the per-record loop when none does.
        seq_total=[
            codec.pack_seq_total(q) if q is not None and q[0] else None
            for q in (cols.seq[i] for i in kept_records)
        ]
        if cols.seq.count(None) != n
        else [None] * len(kept_records),
        seq_microbatches=[
            codec.pack_seq_microbatches(cols.microbatch_seq[i]) if cols.microbatch_seq[i] else None
            for i in kept_records
        ]
        if any(cols.microbatch_seq)
        else [None] * len(kept_records),
        span_host=span_host,
    )
    return block, rejections


def _span_host(
    cols: record_columns.RecordColumns, order: np.ndarray, owner: np.ndarray, kept_records: list[int]
) -> list[bytes | None]:
    """Per kept record, its spans' host views packed in stored span order (codec.SPAN_HOST), or
    None when none of its spans has one (host timing: every CPU job)."""
    host_start, host_duration = cols.span_host_start[order], cols.span_host_duration[order]
    viewed = np.isfinite(host_start)
    if not viewed.any():
        return [None] * len(kept_records)
    has = np.bincount(owner[viewed], minlength=len(cols)) > 0
    out: list[bytes | None] = []
    bounds = np.searchsorted(owner, np.asarray(kept_records, dtype=np.int64))
    ends = np.searchsorted(owner, np.asarray(kept_records, dtype=np.int64), side="right")
    for record, lo, hi in zip(kept_records, bounds.tolist(), ends.tolist(), strict=True):
        out.append(codec.pack_span_host(host_start[lo:hi], host_duration[lo:hi]) if has[record] else None)
    return out


def _in_span_order(record: np.ndarray, start: np.ndarray, duration: np.ndarray) -> bool:
    """Whether spans are sorted by (record, start, longest first) already."""
    if record.size < 2:
        return True
    r0, r1 = record[:-1], record[1:]
    s0, s1 = start[:-1], start[1:]
    later = (s1 > s0) | ((s1 == s0) & (duration[1:] <= duration[:-1]))
    return bool(((r1 > r0) | ((r1 == r0) & later)).all())


def _offsets(counts: np.ndarray) -> np.ndarray:
    """[0, c0, c0 + c1, ...]: where each record's spans start, and the end."""
    out = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


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
    if sample.gpu_index > _INT32_MAX:
        return OUT_OF_RANGE
    for name in _GPU_INT_FIELDS:
        if sample.HasField(name) and getattr(sample, name) > _INT64_MAX:
            return OUT_OF_RANGE
    if any(x > _INT64_MAX for x in sample.xid_events):
        return OUT_OF_RANGE
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
