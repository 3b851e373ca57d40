"""The dedup ledger is pruned by age, and a resend of a pruned batch is still stored once."""

from __future__ import annotations

from sqlalchemy import func, select

from smon_server.context import ServerContext
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.jobs import loop
from smon_server.store import ledger, migrate
from smon_server.store.db import Database
from smon_server.store.models import IngestedBatch, IngestedFloor, StepRecord
from smon_server.store.writes import WriteResult, write_batches
from tests.support import factories as f
from tests.support.settings import server_settings

HOUR = 3600.0
DAY = 86400.0


def send(db: Database, job: str, seq: int, steps: range, now: float) -> WriteResult:
    records = f.dp_job_steps(1, steps, origin=now - 60)[0]
    batch = f.batch(job, 0, 1, seq=seq, steps=records, agent_id=f"{job}-agent")
    return write_batches(db, [validate_batch(batch, Limits())], now=now)[0]


def count(db: Database, model: type) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_a_late_resend_of_a_pruned_batch_is_a_duplicate_and_newer_batches_still_go_in(db: Database) -> None:
    job, t0 = f.new_job_id("ledger"), f.T0
    for seq in (1, 2, 3):
        assert not send(db, job, seq, range(seq * 10, seq * 10 + 3), t0).duplicate
    assert not send(db, job, 4, range(40, 43), t0 + 2 * HOUR).duplicate
    assert count(db, StepRecord) == 12 and count(db, IngestedBatch) == 4

    with db.transaction() as session:
        assert ledger.prune(session, now=t0 + 2 * HOUR, keep_seconds=HOUR) == 3
    assert count(db, IngestedBatch) == 1  # seq 4 is younger than an hour: kept
    with db.session() as session:
        floor = session.get(IngestedFloor, f"{job}-agent")
        assert floor is not None and floor.seq == 3

    # Resent after its ledger row is gone, even with a start time the records never had (so the
    # step records' own key would not catch it): recognised by the floor, nothing stored.
    late = send(db, job, 2, range(20, 23), t0 + 2 * HOUR + 60)
    assert late.duplicate and late.stored.accepted == 3
    again = send(db, job, 2, range(20, 23), t0 + 3 * HOUR)
    assert again.duplicate
    assert count(db, StepRecord) == 12
    # The batch above the floor is still recognised by its ledger row; a new one goes in.
    assert send(db, job, 4, range(40, 43), t0 + 2 * HOUR).duplicate
    assert not send(db, job, 5, range(50, 53), t0 + 2 * HOUR + 60).duplicate
    assert count(db, StepRecord) == 15

    # A later prune raises the floor, never lowers it; floors go with retention.
    with db.transaction() as session:
        assert ledger.prune(session, now=t0 + 20 * DAY, keep_seconds=HOUR, floor_seconds=14 * DAY) == 2
    with db.session() as session:
        floor = session.get(IngestedFloor, f"{job}-agent")
        assert floor is not None and floor.seq == 5
    with db.transaction() as session:
        ledger.prune(session, now=t0 + 40 * DAY, keep_seconds=HOUR, floor_seconds=14 * DAY)
    assert count(db, IngestedFloor) == 0


def test_storage_maintenance_prunes_the_ledger(database_url: str) -> None:
    settings = server_settings(database_url, ingest_ledger_seconds=HOUR, retention_days=14)
    context = ServerContext.from_settings(settings)
    migrate.upgrade(context.db)
    try:
        job = f.new_job_id("maint")
        send(context.db, job, 1, range(0, 3), f.T0)
        send(context.db, job, 2, range(3, 6), f.T0 + 2 * HOUR)
        loop.maintain_storage(context, f.T0 + 2 * HOUR)
        assert count(context.db, IngestedBatch) == 1
        assert send(context.db, job, 1, range(0, 3), f.T0 + 2 * HOUR).duplicate
        assert count(context.db, StepRecord) == 6
    finally:
        context.db.dispose()
