"""Span kind codes per job attempt: stable, shared between replicas, bounded per job, and what one
job sends past its limit is folded into its own `other` without touching any other job."""

from __future__ import annotations

from sqlalchemy import func, select

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store import kinds
from smon_server.store.db import Database
from smon_server.store.models import Job, SpanKind, StepRecord
from smon_server.store.step_window import read_window
from smon_server.store.writes import WriteResult, write_batches
from tests.support import factories as f


def _store(db: Database, job: str, seq: int, steps: list[pb.StepRecord]) -> WriteResult:
    batch = validate_batch(f.batch(job, 0, 1, seq=seq, steps=steps), Limits())
    return write_batches(db, [batch], now=f.T0)[0]


def _names(db: Database, job: str) -> dict[str, int]:
    with db.session() as session:
        key = session.scalar(select(Job.key).where(Job.job_id == job))
        return {
            n: c
            for n, c in session.execute(select(SpanKind.name, SpanKind.code).where(SpanKind.job_key == key))
        }


def test_codes_are_per_job_stable_and_shared_between_processes(db: Database) -> None:
    steps = f.dp_job_steps(1, range(4))[0]
    _store(db, "a", 1, steps[:2])
    first = _names(db, "a")
    assert set(first) == {"data_wait", "forward", "backward", "grad_sync", "optimizer"}
    other = Database(db.url)  # another replica, with an empty cache
    try:
        steps[2].spans.add(kind="eval", start=steps[2].start_time, duration=0.001)
        _store(other, "a", 2, steps[2:])
        assert _names(db, "a") == first | {"eval": max(first.values()) + 1}
    finally:
        other.dispose()
    _store(db, "b", 1, f.dp_job_steps(1, range(1))[0])  # another job: its own dictionary
    assert set(_names(db, "b")) == set(first)
    with db.session() as session:
        job = session.scalars(select(Job).where(Job.job_id == "a")).one()
        assert kinds.kind_names(session, job.key)[first["forward"]] == "forward"
        assert sorted(read_window(session=session, job=job, from_step=None, to_step=None).kinds) == sorted(
            ["", *first, "eval"]
        )


def test_names_past_the_limit_are_folded_into_other_for_that_job_alone(sqlite_url: str) -> None:
    from smon_server.store import migrate

    db = Database(sqlite_url, max_phase_names=3)
    migrate.upgrade(db)
    try:
        steps = f.dp_job_steps(1, range(6))[0]
        for i, step in enumerate(steps):
            step.spans.add(kind=f"eval:{i}", start=step.start_time, duration=0.001)
        # Standard phases never count: the first three made-up names get codes, the rest are
        # stored as `other`; every record is kept.
        results = [_store(db, "noisy", i + 1, [step]) for i, step in enumerate(steps)]
        assert [r.folded_spans for r in results] == [0, 0, 0, 1, 1, 1]
        assert all(not r.stored.rejections for r in results)
        names = _names(db, "noisy")
        assert {"eval:0", "eval:1", "eval:2", "other"} <= set(names)
        assert not {"eval:3", "eval:4", "eval:5"} & set(names)
        with db.session() as session:
            job = session.scalars(select(Job).where(Job.job_id == "noisy")).one()
            assert (job.folded_spans, job.folded_example) == (3, "eval:3")
            records = read_window(session=session, job=job, from_step=None, to_step=None)
            assert len(records) == 6
            kinds_of = [records.kinds[int(k)] for k in records.span_kind[records.span_record >= 3]]
            assert kinds_of.count("other") == 3 and not any(k.startswith("eval") for k in kinds_of)
            assert session.scalar(select(func.count()).select_from(StepRecord)) == 6
        # Another job's names are its own: all get codes.
        quiet = f.dp_job_steps(1, range(1))[0]
        quiet[0].spans.add(kind="compute", start=quiet[0].start_time, duration=0.001)
        assert _store(db, "quiet", 1, quiet).folded_spans == 0
        assert "compute" in _names(db, "quiet")
        # A fresh process (empty cache) folds the same way: the dictionary is full in the database.
        again = Database(sqlite_url, max_phase_names=3)
        try:
            step = f.dp_job_steps(1, range(7))[0][6]
            step.spans.add(kind="eval:new", start=step.start_time, duration=0.002)
            step.spans.add(kind="eval:0", start=step.start_time + 0.002, duration=0.001)
            assert _store(again, "noisy", 7, [step]).folded_spans == 1
        finally:
            again.dispose()
    finally:
        db.dispose()
