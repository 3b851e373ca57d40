"""Turn a RawStep (marks) into a wire StepRecord (seconds), on the shipper thread.

Field by field:
- `start_time` / `end_time`: Unix seconds on the agent clock; `duration`: from the monotonic /
  device clock (end − start of the step's boundary marks).
- `spans`: every timed operation, sorted by start; `gc` pauses of at least `gc_span_min_seconds`.
- `phases`: total seconds per span kind (nested spans count under each kind), plus `other`: the
  part of the step covered by no span at all.
- `gc_count` / `gc_seconds`: every collection that ended in the step, however short.
- `seq` / `microbatch_seq`: sequence statistics (see seqstats.py).
"""

from __future__ import annotations

import time
from typing import Any

from smon.cuda_timing import HostFallbackClock
from smon.seqstats import SeqTotals, reduce_samples
from smon.steps import RawStep
from smon.timing import Clock
from smon.v1 import ingest_pb2 as pb


def is_ready(raw: RawStep) -> bool:
    """Whether every mark of the step can be read without waiting (always true on the host clock).

    A device clock records all of a step's events on one stream, in order, so the step's end
    having completed means every earlier one has: one `query()`."""
    clock = raw.clock
    return not clock.device or clock.ready(raw.end)


def release_marks(raw: RawStep) -> None:
    """A read device step's events go back to its clock's pool: its start, its spans' marks and its
    sequence copies, and its end unless the next recorded step starts there (that step returns it).
    A mark two spans share (one's end, the next one's start) is returned once."""
    clock = raw.clock
    release = getattr(clock, "release", None)
    if release is None:
        return
    marks: dict[int, Any] = {id(raw.start): raw.start}
    for span in raw.spans:
        marks[id(span[1])] = span[1]
        marks[id(span[2])] = span[2]
    for sample in raw.seq:
        event = getattr(sample.lengths, "event", None)
        if event is not None:
            marks[id(event)] = event
    if raw.end_is_next_start:
        marks.pop(id(raw.end), None)
    else:
        marks[id(raw.end)] = raw.end
    release(marks.values())


def covered_seconds(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of [start, end) intervals, clipped to [lo, hi]."""
    total, cur_start, cur_end = 0.0, 0.0, -1.0
    started = False
    for start, end in sorted(intervals):
        start, end = max(start, lo), min(end, hi)
        if end <= start:
            continue
        if not started or start > cur_end:
            if started:
                total += cur_end - cur_start
            cur_start, cur_end, started = start, end, True
        else:
            cur_end = max(cur_end, end)
    if started:
        total += cur_end - cur_start
    return total


def to_step_record(
    raw: RawStep, *, gc_span_min_seconds: float = 0.001, force: bool = False, timeout: float | None = None
) -> pb.StepRecord | None:
    """The StepRecord, or None while CUDA events / device copies are still in flight.

    `force` (at close) or an expired `timeout` reads a device step by its host times instead.
    """
    clock: Clock = raw.clock
    expired = timeout is not None and time.perf_counter() - raw.ended_at > timeout
    if not is_ready(raw):
        if not (force or expired):
            return None
        clock = HostFallbackClock()
    seq = reduce_samples(raw.seq, force=force or expired)
    if seq is None:
        return None
    raw.read_on_device = clock.device

    duration = clock.elapsed(raw.start, raw.end)
    start_time = raw.wall_anchor + clock.host_time(raw.start)
    record = pb.StepRecord(
        step=raw.step, start_time=start_time, end_time=start_time + duration, duration=duration
    )

    # Span offsets are measured from the step's start mark on the same clock as the durations,
    # so on CUDA they place spans where the device ran them.
    # (offset, seconds, kind, micro-batch, chunk, the host's (offset, seconds) of a device-timed span)
    rows: list[tuple[float, float, str, int | None, int, tuple[float, float] | None]] = []
    host_time = clock.host_time
    host_zero = host_time(raw.start)
    for kind, start, end, microbatch, chunk in raw.spans:
        offset = clock.elapsed(raw.start, start)
        host = None
        if clock.device:
            host = (host_time(start) - host_zero, max(0.0, host_time(end) - host_time(start)))
        rows.append((offset, max(0.0, clock.elapsed(start, end)), kind, microbatch, chunk, host))
    gc_seconds = 0.0
    for gc_start, seconds in raw.gc_pauses:
        gc_seconds += seconds
        if seconds >= gc_span_min_seconds:
            # GC is a host pause: placed by host time relative to the step's host start.
            rows.append((gc_start - host_zero, seconds, "gc", None, 0, None))
    rows.sort(key=lambda r: r[0])

    phases: dict[str, float] = {}
    for offset, seconds, kind, microbatch, chunk, host in rows:
        span = record.spans.add(kind=kind, start=start_time + offset, duration=seconds, chunk=chunk)
        if microbatch is not None:
            span.microbatch = microbatch
        if host is not None:
            span.host_start = start_time + host[0]
            span.host_duration = host[1]
        phases[kind] = phases.get(kind, 0.0) + seconds
    if raw.gc_pauses:
        phases["gc"] = gc_seconds  # every pause, including those too short to be spans
    covered = covered_seconds([(r[0], r[0] + r[1]) for r in rows], 0.0, duration)
    phases["other"] = max(0.0, duration - covered)
    for kind, seconds in phases.items():
        record.phases[kind] = seconds
    record.gc_count = len(raw.gc_pauses)
    record.gc_seconds = gc_seconds

    total, per_microbatch = seq
    if total.count:
        record.seq.CopyFrom(_seq_stats(total))
        for microbatch in sorted(per_microbatch):
            totals = per_microbatch[microbatch]
            record.microbatch_seq.add(microbatch=microbatch, seq=_seq_stats(totals))
    return record


def _seq_stats(totals: SeqTotals) -> pb.SequenceStats:
    return pb.SequenceStats(
        count=totals.count, tokens=totals.tokens, sum_sq=totals.sum_sq, max_len=totals.max_len
    )
