"""Validation keeps the valid records of a batch and names what is wrong with the rest."""

from __future__ import annotations

import math

import pytest

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest import validate as v
from tests.support import factories as f

LIMITS = v.Limits(max_batch_records=100, max_spans_per_step=16, max_duration_seconds=3600)


def _batch_with(records: list[pb.StepRecord]) -> pb.Batch:
    return f.batch("job", 0, 2, steps=records)


def good(step: int) -> pb.StepRecord:
    return f.dp_step(step, start=f.T0 + step)


def test_valid_batch_keeps_every_record_and_shifts_to_server_clock() -> None:
    b = _batch_with([good(0), good(1)])
    b.clock_offset = 2.5
    out = v.validate_batch(b, LIMITS)
    assert out.rejections == []
    assert out.steps.step.tolist() == [0, 1]
    assert out.steps.start_time[0] == pytest.approx(f.T0 + 2.5)
    # span starts are stored relative to the step start, so the offset does not touch them
    assert out.steps.spans(0)[0][:2] == ("data_wait", 0.0)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: setattr(r, "step", -1), v.NEGATIVE_STEP),
        (lambda r: setattr(r, "duration", math.nan), v.NON_FINITE),
        (lambda r: r.phases.__setitem__("forward", math.inf), v.NON_FINITE),
        (lambda r: setattr(r.spans[1], "duration", -0.5), v.NEGATIVE_DURATION),
        (lambda r: setattr(r, "duration", 1e9), v.ABSURD_DURATION),
        (lambda r: setattr(r, "end_time", r.start_time - 10), v.END_BEFORE_START),
        (lambda r: setattr(r, "start_time", 0.0), v.BAD_TIME),
        (lambda r: r.spans.extend([pb.Span(kind="x", start=r.start_time)] * 20), v.TOO_MANY_SPANS),
        (lambda r: r.phases.__setitem__("", 0.1), v.BAD_NAME),
    ],
)
def test_bad_record_is_rejected_and_neighbours_kept(mutate, reason: str) -> None:
    bad = good(1)
    mutate(bad)
    out = v.validate_batch(_batch_with([good(0), bad, good(2)]), LIMITS)
    assert out.steps.step.tolist() == [0, 2]
    assert [(r.kind, r.index, r.reason) for r in out.rejections] == [("step", 1, reason)]


def test_duplicate_step_in_one_batch_is_rejected_once() -> None:
    out = v.validate_batch(_batch_with([good(3), good(3)]), LIMITS)
    assert len(out.steps) == 1
    assert [r.reason for r in out.rejections] == [v.DUPLICATE_STEP]


def test_records_over_the_batch_limit_are_rejected_not_dropped_silently() -> None:
    limits = v.Limits(max_batch_records=3)
    out = v.validate_batch(_batch_with([good(i) for i in range(5)]), limits)
    assert len(out.steps) == 3
    assert [r.reason for r in out.rejections] == [v.BATCH_TOO_LARGE] * 2


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: setattr(b, "agent_id", ""), v.MISSING_AGENT_ID),
        (lambda b: setattr(b, "seq", 0), v.MISSING_SEQ),
        (lambda b: setattr(b.coords, "job", ""), v.MISSING_JOB),
        (lambda b: setattr(b.coords, "rank", 5), v.BAD_COORDINATES),
        (lambda b: setattr(b, "clock_offset", math.nan), v.BAD_CLOCK_OFFSET),
        (lambda b: setattr(b.coords, "host", "h" * 257), v.BAD_COORDINATES),
        (lambda b: setattr(b.coords, "gpu_uuid", "GPU-\x00"), v.BAD_COORDINATES),
        (lambda b: setattr(b.coords, "job", "job\x00"), v.MISSING_JOB),
    ],
)
def test_batch_without_identity_is_rejected_whole(mutate, reason: str) -> None:
    b = _batch_with([good(0)])
    mutate(b)
    with pytest.raises(v.BatchRejected) as info:
        v.validate_batch(b, LIMITS)
    assert info.value.reason == reason


def test_gpu_samples_validated_per_sample() -> None:
    ok = pb.GpuSample(time=f.T0, gpu_index=0, sm_clock_mhz=1400, temperature_c=70)
    nan = pb.GpuSample(time=f.T0, gpu_index=1, power_w=math.nan)
    negative = pb.GpuSample(time=f.T0, gpu_index=2, gpu_util=-1)
    b = f.batch("job", 0, 1, gpu_samples=[ok, nan, negative])
    out = v.validate_batch(b, LIMITS)
    assert [row["gpu_index"] for row in out.gpu_samples] == [0]
    assert out.gpu_samples[0]["power_w"] is None  # unset fields stay unknown, not zero
    assert [r.reason for r in out.rejections] == [v.NON_FINITE, v.NEGATIVE_VALUE]


def test_unknown_fields_are_counted_not_fatal() -> None:
    data = _batch_with([good(0)]).SerializeToString() + bytes([0xF8, 0x06, 0x01])  # field 111
    out = v.validate_batch(pb.Batch.FromString(data), LIMITS)
    assert out.unknown_fields == 1
    assert len(out.steps) == 1


# -- found by tests/ingest/test_grpc_fuzz.py ---------------------------------------------------------
def test_a_table_declaring_billions_of_records_is_one_rejection_at_once() -> None:
    """It once built a rejection per declared record: 3 M records cost 1.6 GB and 5 s, 2^32 an OOM
    kill. The records sent beside the table as messages are kept."""
    b = _batch_with([good(0)])
    b.step_table.records = 2**32 - 1
    out = v.validate_batch(b, LIMITS)
    assert out.steps.step.tolist() == [0]
    assert [(r.kind, r.index, r.reason) for r in out.rejections] == [("step_table", -1, v.BAD_TABLE)]


def test_messages_and_samples_past_twice_the_limit_are_refused_whole() -> None:
    b = _batch_with([good(i) for i in range(2 * LIMITS.max_batch_records + 1)])
    with pytest.raises(v.BatchRejected) as refused:
        v.validate_batch(b, LIMITS)
    assert refused.value.reason == v.BATCH_TOO_LARGE


def test_a_refused_records_span_kind_is_not_named_to_the_store() -> None:
    """Found by the fuzz on PostgreSQL: a refused record's too-long or NUL kind still went into
    the batch's kind names, and the kind dictionary's column refused the whole group."""
    bad = good(1)
    bad.spans[0].kind = "k" * 129
    worse = good(2)
    worse.spans[0].kind = "for\x00ward"
    out = v.validate_batch(_batch_with([good(0), bad, worse]), LIMITS)
    assert out.steps.step.tolist() == [0]
    assert all(v.good_name(k) for k in out.steps.kind_names)
    stored = sorted(out.steps.kind_names[k] for k in out.steps.span_kind)
    assert stored == sorted(s.kind for s in good(0).spans)


def test_a_malformed_table_within_the_limit_is_one_rejection() -> None:
    b = _batch_with([good(0)])
    b.step_table.records = 150  # columns missing
    out = v.validate_batch(b, LIMITS)
    assert out.steps.step.tolist() == [0]
    assert [(r.kind, r.index, r.reason) for r in out.rejections] == [("step_table", -1, v.BAD_TABLE)]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: setattr(c, "dp_rank", 2),
        lambda c: setattr(c, "pp_rank", 2**31 - 1),
        lambda c: setattr(c, "tp_rank", 5),
        lambda c: setattr(c, "dp_size", 3),
        lambda c: setattr(c, "tp_size", -1),
        lambda c: setattr(c, "world_size", 2**31 - 1),
        lambda c: setattr(c, "backend", "gl\x00o"),
    ],
)
def test_parallel_ranks_past_the_world_and_nul_backend_are_refused(mutate) -> None:
    b = _batch_with([good(0)])  # world_size 2
    mutate(b.coords)
    with pytest.raises(v.BatchRejected) as refused:
        v.validate_batch(b, LIMITS)
    assert refused.value.reason == v.BAD_COORDINATES


def test_values_past_their_columns_never_reach_the_database() -> None:
    """A heartbeat phase with NUL or too long, uint64 counters and GPU fields past signed 64 bits,
    a GPU index past int32: the database refused them, and with them the whole batch."""
    b = _batch_with([good(0)])
    b.heartbeat.CopyFrom(pb.Heartbeat(time=f.T0, phase="x\x00" * 100))
    b.counters.CopyFrom(pb.AgentCounters(dropped_records=2**64 - 1, errors=7))
    b.gpu_samples.add(time=f.T0, gpu_index=2**32 - 1)
    b.gpu_samples.add(time=f.T0, gpu_index=0, ecc_corrected=2**64 - 1)
    b.gpu_samples.add(time=f.T0, gpu_index=1, xid_events=[2**63])
    b.gpu_samples.add(time=f.T0, gpu_index=2, power_w=50.0)
    out = v.validate_batch(b, LIMITS)
    assert out.steps.step.tolist() == [0] and len(out.gpu_samples) == 1
    assert out.heartbeat is None
    assert out.counters is not None and (out.counters.dropped_records, out.counters.errors) == (2**63 - 1, 7)
    assert sorted((r.kind, r.reason) for r in out.rejections) == [
        ("gpu_sample", v.OUT_OF_RANGE),
        ("gpu_sample", v.OUT_OF_RANGE),
        ("gpu_sample", v.OUT_OF_RANGE),
        ("heartbeat", v.BAD_NAME),
    ]


def test_a_span_starting_far_from_its_step_is_absurd() -> None:
    bad = good(1)
    bad.spans[0].start = -1e300  # stored as a float32 offset from the step start: -inf
    out = v.validate_batch(_batch_with([good(0), bad]), LIMITS)
    assert [(r.index, r.reason) for r in out.rejections] == [(1, v.ABSURD_DURATION)]


def test_spans_sent_out_of_order_are_stored_as_spans_sent_in_order() -> None:
    """The store keeps each record's spans by start, an enclosing span before its contents; agents
    send them so (validation then skips its sort), and any other order gives the same block."""
    in_order = [good(i) for i in range(4)]
    shuffled = [good(i) for i in range(4)]
    for record in shuffled:
        spans = list(record.spans)
        record.ClearField("spans")
        record.spans.extend(reversed(spans))
    a = v.validate_batch(_batch_with(in_order), LIMITS).steps
    b = v.validate_batch(_batch_with(shuffled), LIMITS).steps
    assert a.span_offsets.tolist() == b.span_offsets.tolist()
    assert a.span_start.tolist() == b.span_start.tolist()
    assert [a.kind_names[k] for k in a.span_kind] == [b.kind_names[k] for k in b.span_kind]
    assert sorted(a.span_start[: a.span_offsets[1]]) == a.span_start[: a.span_offsets[1]].tolist()
