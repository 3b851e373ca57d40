"""Step records sent as one StepTable are stored exactly as the same records sent as messages,
and a bad value in a table costs its record only (a table that does not fit together, its own)."""

from __future__ import annotations

import random
from dataclasses import fields

import numpy as np
import pytest

from smon.table import to_table
from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store.rows import StepBlock
from tests.support import factories as f


def varied_records(n: int, rng: random.Random) -> list[pb.StepRecord]:
    """DP steps plus what pipeline and sequence-aware jobs add: micro-batch spans, model chunks,
    GC, sequence statistics per step and per micro-batch."""
    records = []
    t = f.T0
    for step in range(n):
        record = f.dp_step(
            step, start=t, forward=0.01 + rng.random() * 0.005, gc=[(0.001, 0.0004)] * (step % 3)
        )
        if step % 2:
            record.spans.append(
                pb.Span(kind="forward-send", start=t + 0.005, duration=0.001, microbatch=step % 4, chunk=1)
            )
            record.seq.CopyFrom(
                pb.SequenceStats(count=4, tokens=4096 + step, sum_sq=5e6 + step, max_len=1500)
            )
        if step % 3 == 0:
            for mb in range(2):
                record.microbatch_seq.append(
                    pb.MicroBatchSequences(
                        microbatch=mb, seq=pb.SequenceStats(count=2, tokens=99, sum_sq=4e3, max_len=60)
                    )
                )
        records.append(record)
        t = record.end_time + 0.001
    return records


def as_table(records: list[pb.StepRecord], seq: int = 1) -> pb.Batch:
    batch = f.batch("tbl", 0, 2, seq=seq)
    batch.step_table.CopyFrom(to_table(records))
    return batch


def assert_same(a: StepBlock, b: StepBlock) -> None:
    assert len(a) == len(b)
    for field in fields(StepBlock):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y, err_msg=field.name)
            assert x.dtype == y.dtype, field.name
        else:
            assert x == y, field.name


@pytest.mark.parametrize("seed", range(5))
def test_a_table_is_stored_as_its_records_are(seed: int) -> None:
    records = varied_records(40, random.Random(seed))
    batch = f.batch("tbl", 0, 2, steps=records)
    batch.clock_offset = 0.25
    rows = validate_batch(batch, Limits())
    tbatch = as_table(records)
    tbatch.clock_offset = 0.25
    tabled = validate_batch(tbatch, Limits())
    assert not rows.rejections and not tabled.rejections
    assert_same(rows.steps, tabled.steps)
    assert tabled.accepted == rows.accepted == 40


def test_rows_and_a_table_in_one_batch_are_checked_together() -> None:
    records = varied_records(10, random.Random(1))
    batch = f.batch("tbl", 0, 2, steps=records[:4])
    batch.step_table.CopyFrom(to_table(records[3:]))  # step 3 in both: the second one is a repeat
    valid = validate_batch(batch, Limits())
    assert valid.steps.step.tolist() == list(range(10))
    assert [(r.index, r.reason) for r in valid.rejections] == [(4, "duplicate_step")]


def test_bad_values_in_a_table_cost_their_records_only() -> None:
    records = varied_records(12, random.Random(2))
    records[2].duration = float("nan")
    records[5].spans[1].duration = -1.0
    records[7].spans[0].kind = "x" * 200
    records[9].spans[0].kind = "nul\x00"
    records[10].spans.append(
        pb.Span(kind="forward", start=records[10].start_time, duration=0.01, microbatch=70000)
    )
    valid = validate_batch(as_table(records), Limits())
    reasons = {r.index: r.reason for r in valid.rejections}
    assert reasons == {2: "non_finite", 5: "negative_duration", 7: "bad_name", 9: "bad_name", 10: "bad_span"}
    assert valid.steps.step.tolist() == [s for s in range(12) if s not in reasons]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda t: setattr(t, "duration", t.duration[:-8]),  # a column one entry short
        lambda t: setattr(t, "records", t.records + 1),  # more records than the columns hold
        lambda t: setattr(t, "span_kind", b"\xff\x7f" * (len(t.span_kind) // 2)),  # kinds past the list
        lambda t: setattr(t, "seq_tokens", b""),  # seq_count without its companions
    ],
)
def test_a_table_that_does_not_fit_together_is_refused_with_the_rows_beside_it_kept(breakage: object) -> None:
    records = varied_records(8, random.Random(3))
    batch = f.batch("tbl", 0, 2, steps=[f.dp_step(100, start=f.T0 + 100)])
    table = to_table(records)
    breakage(table)  # type: ignore[operator]
    batch.step_table.CopyFrom(table)
    valid = validate_batch(batch, Limits())
    assert valid.steps.step.tolist() == [100]
    # One refusal for the whole table (not one per declared record: a table may declare billions).
    assert [(r.kind, r.index, r.reason) for r in valid.rejections] == [("step_table", -1, "bad_table")]
    assert f"{table.records} records refused" in valid.rejections[0].detail


def test_the_budget_counts_table_records() -> None:
    records = varied_records(30, random.Random(4))
    valid = validate_batch(as_table(records), Limits(max_batch_records=25))
    assert len(valid.steps) == 25
    assert [r.reason for r in valid.rejections] == ["batch_too_large"] * 5
