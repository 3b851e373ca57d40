"""Both wire forms are held to the same checks: every broken record of one table of cases
(tests/ingest/wire_cases.py) is refused with the same reason whether it travels as a StepRecord
message or in a StepTable, and the valid record beside it is kept either way."""

from __future__ import annotations

import pytest

from smon.table import to_table
from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import Limits, validate_batch
from tests.ingest.wire_cases import MESSAGE_CASES, RECORD_CASES, Breakage
from tests.support import factories as f


def _record(step: int) -> pb.StepRecord:
    r = f.dp_step(step, start=f.T0 + step)
    r.spans[1].microbatch = 0
    r.seq.CopyFrom(pb.SequenceStats(count=2, tokens=10, sum_sq=50.0, max_len=6))
    r.microbatch_seq.add(microbatch=0, seq=pb.SequenceStats(count=1, tokens=5, sum_sq=25.0, max_len=5))
    return r


def _batch(records: list[pb.StepRecord], form: str) -> pb.Batch:
    if form == "message":
        return f.batch("forms", 0, 1, steps=records)
    b = f.batch("forms", 0, 1, steps=[])
    b.step_table.CopyFrom(to_table(records))
    return b


# Every case in both forms; the message-only ones (phase totals: a table has none) as messages.
CASES = [
    pytest.param(case, form, id=f"{name}-{form}")
    for name, case in RECORD_CASES.items()
    for form in ("message", "table")
] + [pytest.param(case, "message", id=f"{name}-message") for name, case in MESSAGE_CASES.items()]


@pytest.mark.parametrize(("case", "form"), CASES)
def test_a_broken_record_is_refused_alike_in_both_forms(case: Breakage, form: str) -> None:
    good, bad = _record(1), _record(2)
    case.breaks(bad)
    valid = validate_batch(_batch([good, bad], form), Limits())
    assert [(r.kind, r.index, r.reason) for r in valid.rejections] == [("step", 1, case.reason)]
    assert valid.steps.step.tolist() == [1]


@pytest.mark.parametrize("form", ["message", "table"])
def test_the_edges_of_each_range_are_kept_in_both_forms(form: str) -> None:
    r = _record(1)
    r.spans[0].chunk = 32_767
    r.spans[1].microbatch = 32_767
    r.spans[2].microbatch = -1
    r.microbatch_seq[0].microbatch = -32_768
    r.gc_count = 2**32 - 1  # stored as the column's maximum
    valid = validate_batch(_batch([r], form), Limits())
    assert not valid.rejections and len(valid.steps) == 1
