"""Broken step records, one table for both wire forms: each case breaks one valid record and
names the reason ingest must refuse it with, whether it travels as a StepRecord message or in a
StepTable (tests/ingest/test_wire_forms.py runs every case through each; the gRPC fuzz draws from
the same table)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest import validate as v


@dataclass(frozen=True)
class Breakage:
    breaks: Callable[[pb.StepRecord], object]
    reason: str


def _mb_row(r: pb.StepRecord) -> pb.MicroBatchSequences:
    """The record's first micro-batch sequence row (one is added where it has none)."""
    return (
        r.microbatch_seq[0] if len(r.microbatch_seq) else r.microbatch_seq.add(seq=pb.SequenceStats(count=1))
    )


def _many_spans(r: pb.StepRecord) -> None:
    for _ in range(v.Limits().max_spans_per_step + 1 - len(r.spans)):
        r.spans.add(kind="forward", start=r.start_time, duration=0.0)


# A record these apply to is valid and has a span.
RECORD_CASES: dict[str, Breakage] = {
    "negative_step": Breakage(lambda r: setattr(r, "step", -1 - r.step), v.NEGATIVE_STEP),
    "nan_duration": Breakage(lambda r: setattr(r, "duration", math.nan), v.NON_FINITE),
    "inf_start": Breakage(lambda r: setattr(r, "start_time", math.inf), v.NON_FINITE),
    "zero_start": Breakage(lambda r: setattr(r, "start_time", 0.0), v.BAD_TIME),
    "negative_end": Breakage(lambda r: setattr(r, "end_time", -5.0), v.BAD_TIME),
    "end_before_start": Breakage(lambda r: setattr(r, "end_time", r.start_time - 10), v.END_BEFORE_START),
    "negative_duration": Breakage(lambda r: setattr(r, "duration", -1.0), v.NEGATIVE_DURATION),
    "huge_duration": Breakage(lambda r: setattr(r, "duration", 1e300), v.ABSURD_DURATION),
    "nan_gc": Breakage(lambda r: setattr(r, "gc_seconds", math.nan), v.NON_FINITE),
    "negative_gc": Breakage(lambda r: setattr(r, "gc_seconds", -0.5), v.NEGATIVE_DURATION),
    "huge_gc": Breakage(lambda r: setattr(r, "gc_seconds", 1e9), v.ABSURD_DURATION),
    "nul_kind": Breakage(lambda r: setattr(r.spans[0], "kind", "for\x00ward"), v.BAD_NAME),
    "empty_kind": Breakage(lambda r: setattr(r.spans[0], "kind", ""), v.BAD_NAME),
    "long_kind": Breakage(lambda r: setattr(r.spans[0], "kind", "k" * 129), v.BAD_NAME),
    "nan_span": Breakage(lambda r: setattr(r.spans[0], "duration", math.nan), v.NON_FINITE),
    "negative_span": Breakage(lambda r: setattr(r.spans[0], "duration", -1.0), v.NEGATIVE_DURATION),
    "huge_span": Breakage(lambda r: setattr(r.spans[0], "duration", 1e9), v.ABSURD_DURATION),
    "span_start_inf": Breakage(lambda r: setattr(r.spans[0], "start", -math.inf), v.NON_FINITE),
    "span_start_far": Breakage(lambda r: setattr(r.spans[0], "start", r.start_time + 1e6), v.ABSURD_DURATION),
    "too_many_spans": Breakage(_many_spans, v.TOO_MANY_SPANS),
    "microbatch_past": Breakage(lambda r: setattr(r.spans[0], "microbatch", 40_000), v.BAD_SPAN),
    "microbatch_below": Breakage(lambda r: setattr(r.spans[0], "microbatch", -7), v.BAD_SPAN),
    "chunk_past": Breakage(lambda r: setattr(r.spans[0], "chunk", 2**31 - 1), v.BAD_SPAN),
    "chunk_past_int16": Breakage(lambda r: setattr(r.spans[0], "chunk", 40_000), v.BAD_SPAN),
    "negative_chunk": Breakage(lambda r: setattr(r.spans[0], "chunk", -1), v.BAD_SPAN),
    "nan_sum_sq": Breakage(
        lambda r: r.seq.MergeFrom(pb.SequenceStats(count=1, sum_sq=math.nan)), v.NON_FINITE
    ),
    "negative_sum_sq": Breakage(
        lambda r: r.seq.MergeFrom(pb.SequenceStats(count=1, sum_sq=-1.0)), v.NON_FINITE
    ),
    "mb_seq_past": Breakage(lambda r: setattr(_mb_row(r), "microbatch", 70_000), v.BAD_SPAN),
    "mb_seq_below": Breakage(lambda r: setattr(_mb_row(r), "microbatch", -40_000), v.BAD_SPAN),
    "mb_seq_nan_sum_sq": Breakage(lambda r: setattr(_mb_row(r).seq, "sum_sq", math.nan), v.NON_FINITE),
    "mb_seq_negative_sum_sq": Breakage(lambda r: setattr(_mb_row(r).seq, "sum_sq", -5.0), v.NON_FINITE),
}

# Message form only: a table carries no phase totals.
MESSAGE_CASES: dict[str, Breakage] = {
    "nan_phase": Breakage(lambda r: r.phases.update({"forward": math.nan}), v.NON_FINITE),
    "negative_phase": Breakage(lambda r: r.phases.update({"forward": -1.0}), v.NEGATIVE_DURATION),
    "nul_phase": Breakage(lambda r: r.phases.update({"a\x00b": 1.0}), v.BAD_NAME),
    "long_phase": Breakage(lambda r: r.phases.update({"p" * 200: 1.0}), v.BAD_NAME),
    "huge_phase": Breakage(lambda r: r.phases.update({"forward": 1e12}), v.ABSURD_DURATION),
}
