"""Span kind codes: assigned once, shared, and a full dictionary refuses records, not batches."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store import kinds
from smon_server.store.db import Database
from smon_server.store.models import SpanKind, StepRecord
from smon_server.store.writes import TOO_MANY_KINDS, write_batch
from tests import factories as f


def test_codes_are_stable_and_shared_between_processes(db: Database) -> None:
    first = db.kinds.codes(db.transaction, ["forward", "backward"])
    other = kinds.SpanKinds()  # another replica, with an empty cache
    assert other.codes(db.transaction, ["backward", "eval", "forward"]) == first | {"eval": 3}
    with db.session() as session:
        assert kinds.kind_names(session) == ("", "backward", "forward", "eval")


def test_a_full_dictionary_refuses_the_records_that_need_a_new_kind(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kinds, "MAX_KINDS", 5)
    steps = f.dp_job_steps(1, range(5))[0]  # five kinds: data_wait ... optimizer
    first = f.batch("full", 0, 1, seq=1, steps=steps[:2])
    write_batch(db, validate_batch(first, Limits()), now=f.T0)
    steps[3].spans.add(kind="eval", start=steps[3].start_time, duration=0.001)  # a sixth
    second = f.batch("full", 0, 1, seq=2, steps=steps[2:])
    result = write_batch(db, validate_batch(second, Limits()), now=f.T0)
    assert result.stored.steps.step.tolist() == [2, 4]
    assert [r.reason for r in result.stored.rejections] == [TOO_MANY_KINDS]
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(StepRecord)) == 4
        assert session.scalar(select(func.count()).select_from(SpanKind)) == 5
