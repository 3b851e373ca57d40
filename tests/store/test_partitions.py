"""Day partitions of step records (PostgreSQL), retention on both databases, and a finished job's
stored analysis outliving its raw steps."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from smon_server.ingest.validate import Limits, validate_batch
from smon_server.jobs import loop
from smon_server.store import partitions
from smon_server.store.db import Database
from smon_server.store.models import AnalysisResult, Job, StepRecord
from smon_server.store.step_window import read_window
from smon_server.store.writes import write_batches
from tests.support import factories as f
from tests.support.settings import server_settings

DAY = partitions.DAY_SECONDS


def store(db: Database, job: str, origin: float, steps: range) -> None:
    per_rank = f.dp_job_steps(2, steps, origin=origin)
    for rank in (0, 1):
        batch = f.batch(job, rank, 2, seq=steps.start + 1, steps=per_rank[rank], agent_id=f"{job}-{rank}")
        write_batches(db, [validate_batch(batch, Limits())], now=origin)


def count(db: Database, table: str = "step_records") -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(text(table))) or 0)


def test_records_move_into_their_day_partition_and_old_days_are_dropped(db: Database) -> None:
    if not db.is_postgres:
        pytest.skip("native partitions are PostgreSQL's; SQLite keeps one table (next test)")
    now = f.T0 + 30 * DAY
    store(db, "old", f.T0, range(0, 20))  # 30 days ago: no day partition yet, so the default holds it
    store(db, "new", now, range(0, 20))
    assert count(db, "step_records_default") == 80
    with db.transaction() as session:
        made = partitions.ensure_partitions(session, now=now, days_ahead=1, days_back=30)
    assert partitions.day_name(partitions.day_start(f.T0)) in made
    assert count(db, "step_records_default") == 0  # each day's rows moved into its partition
    assert count(db) == 80
    with db.transaction() as session:
        dropped = partitions.drop_expired(session, now=now, retention_days=14, postgres=True)
    assert dropped >= 1
    with db.session() as session:
        new = session.scalars(select(Job).where(Job.job_id == "new")).one()
        old = session.scalars(select(Job).where(Job.job_id == "old")).one()
        assert len(read_window(session=session, job=new, from_step=None, to_step=None)) == 40
        assert len(read_window(session=session, job=old, from_step=None, to_step=None)) == 0


def test_retention_keeps_the_stored_analysis_of_a_job_whose_steps_are_gone(database_url: str) -> None:
    settings = server_settings(database_url, retention_days=14, warmup_steps=0)
    from smon_server.context import ServerContext
    from smon_server.store import migrate

    context = ServerContext.from_settings(settings)
    migrate.upgrade(context.db)
    try:
        store(context.db, "done", f.T0, range(0, 30))
        assert loop.analyse_one(context, "done", f.T0 + 60)
        with context.db.session() as session:
            before = session.get(AnalysisResult, ("done", 1))
            assert before is not None and before.steps_seen > 0
            summary_before = dict(before.summary or {})
        later = f.T0 + 20 * DAY
        loop.maintain_storage(context, later)
        with context.db.session() as session:
            left = session.scalar(select(func.count()).select_from(StepRecord))
        assert left == 0
        loop.analysis_pass(context, later)
        with context.db.session() as session:
            after = session.get(AnalysisResult, ("done", 1))
            assert after is not None and after.state == "finished"  # its agents went quiet
            assert after.summary == summary_before | {"state": "finished"}
            assert after.steps_seen == before.steps_seen and after.slowdown == before.slowdown
    finally:
        context.close()
