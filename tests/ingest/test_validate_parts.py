"""validate_parts (a host relay's batches, ingest/service.py StreamHost): the parts' StepTables
checked as one set of columns give each batch exactly what validate_batch gives it alone."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smon.table import to_table
from smon.v1 import ingest_pb2 as pb
from smon_server.ingest import record_columns
from smon_server.ingest import validate as v
from smon_server.store.rows import ValidBatch
from tests.ingest.wire_cases import RECORD_CASES
from tests.support import factories as f

_BLOCK_FIELDS = ("step", "start_time", "duration", "gc_count", "gc_seconds", "span_offsets", "span_start",
                 "span_duration", "span_microbatch", "span_chunk")  # fmt: skip


def _part(job: str, rank: int, records: list[pb.StepRecord], *, offset: float = 0.0) -> pb.Batch:
    batch = f.batch(job, rank, 4, seq=7)
    batch.clock_offset = offset
    batch.heartbeat.CopyFrom(pb.Heartbeat(time=f.T0, last_step=3))
    batch.step_table.CopyFrom(to_table(records))
    return batch


def _host(job: str, broken: pb.StepRecord | None = None) -> list[pb.Batch]:
    per_rank = f.dp_job_steps(4, range(4))
    if broken is not None:
        per_rank[1][1] = broken
    repeated = [*per_rank[2], per_rank[2][0]]  # a step twice in one batch: the second refused
    return [
        _part(job, 0, per_rank[0]),
        _part(job, 1, per_rank[1], offset=0.25),
        _part(job, 2, repeated, offset=-3.0),
        _part(job, 3, per_rank[3]),
    ]


def _same(alone: ValidBatch | v.BatchRejected, merged: ValidBatch | v.BatchRejected) -> None:
    if isinstance(alone, v.BatchRejected):
        assert isinstance(merged, v.BatchRejected) and merged.reason == alone.reason
        return
    assert isinstance(merged, ValidBatch)
    assert merged.rejections == alone.rejections
    assert merged.heartbeat == alone.heartbeat and merged.agent_id == alone.agent_id
    a, m = alone.steps, merged.steps
    for name in _BLOCK_FIELDS:
        assert np.array_equal(getattr(a, name), getattr(m, name), equal_nan=True), name
    assert [a.kind_names[k] for k in a.span_kind] == [m.kind_names[k] for k in m.span_kind]
    assert (a.seq_total, a.seq_microbatches, a.span_host) == (m.seq_total, m.seq_microbatches, m.span_host)


def _check(parts: list[pb.Batch], limits: v.Limits) -> list[ValidBatch | v.BatchRejected]:
    merged = v.validate_parts(parts, limits)
    for part, outcome in zip(parts, merged, strict=True):
        try:
            alone: ValidBatch | v.BatchRejected = v.validate_batch(part, limits)
        except v.BatchRejected as rejected:
            alone = rejected
        _same(alone, outcome)
    return merged


def test_clean_parts_are_read_as_one_table_and_come_back_as_each_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = record_columns.from_table

    def counted(table: pb.StepTable) -> record_columns.RecordColumns:
        calls.append(table.records)
        return real(table)

    monkeypatch.setattr(record_columns, "from_table", counted)
    merged = v.validate_parts(_host(f.new_job_id()), v.Limits())
    assert calls == [17]  # one read of all four parts' records
    monkeypatch.setattr(record_columns, "from_table", real)
    _check(_host(f.new_job_id()), v.Limits())
    assert [len(b.steps) for b in merged if isinstance(b, ValidBatch)] == [4, 4, 4, 4]
    second = merged[1]
    assert isinstance(second, ValidBatch)
    assert second.steps.start_time[0] == pytest.approx(f.T0 + 0.25)  # its own clock offset
    third = merged[2]
    assert isinstance(third, ValidBatch)
    assert [(r.index, r.reason) for r in third.rejections] == [(4, v.DUPLICATE_STEP)]


@pytest.mark.parametrize("case", sorted(RECORD_CASES))
def test_a_broken_record_is_refused_in_its_own_batch_only(case: str) -> None:
    record = f.dp_job_steps(4, range(4))[1][1]
    RECORD_CASES[case].breaks(record)
    _check(_host(f.new_job_id(), record), v.Limits())


def test_budgets_repeats_and_refused_batches_count_per_batch() -> None:
    job = f.new_job_id()
    parts = _host(job)
    parts.append(f.batch("", 0, 4))  # no job: refused whole
    parts[3].step_table.step = parts[3].step_table.step[:-8]  # a table whose columns do not fit
    other_job = _part(f.new_job_id(), 0, f.dp_job_steps(1, range(3))[0])
    nan = f.dp_job_steps(1, range(2))[0]
    nan[0].duration = math.nan
    outcomes = _check([*parts, other_job, _part(job, 1, nan)], v.Limits(max_batch_records=3))
    assert isinstance(outcomes[4], v.BatchRejected)
    third = outcomes[2]
    assert isinstance(third, ValidBatch)
    assert [(r.index, r.reason) for r in third.rejections] == [(3, v.BATCH_TOO_LARGE), (4, v.DUPLICATE_STEP)]
