"""Group commit: batches of many streams share a transaction, each is acked after its commit, a
bad batch fails alone, and the writer pushes back when it falls behind."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest import commits
from smon_server.ingest.commits import GroupCommitter
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store import kinds, migrate, row_keys
from smon_server.store.db import Database
from smon_server.store.models import Agent, Job, StepRecord
from smon_server.store.rows import ValidBatch
from smon_server.store.writes import WriteResult, write_batches
from tests.support import factories as f
from tests.support.databases import fresh_database
from tests.support.stored import store_batches

STEPS = f.dp_job_steps(4, range(20))


def valid(rank: int, seq: int, steps: range, *, job: str = "grouped", agent: str | None = None) -> ValidBatch:
    batch = f.batch(job, rank, 4, seq=seq, steps=STEPS[rank][steps.start : steps.stop], agent_id=agent)
    return validate_batch(batch, Limits())


def stored_steps(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(StepRecord)) or 0)


class Gate:
    """Wraps write_batches: the first call waits until released, every call's batches are kept."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls: list[list[str]] = []

    def __call__(
        self, db: Database, batches: Sequence[ValidBatch], now: float, **kwargs: Any
    ) -> list[WriteResult]:
        self.calls.append([f"{b.agent_id}/{b.seq}" for b in batches])
        if len(self.calls) == 1:
            self.entered.set()
            self.release.wait(10)
        if any(b.agent_id == "poison" for b in batches):
            raise RuntimeError("the database refused this batch")
        return write_batches(db, batches, now, **kwargs)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    g = Gate()
    monkeypatch.setattr(commits, "write_batches", g)
    return g


async def wait_entered(gate: Gate) -> None:
    while not gate.entered.is_set():
        await asyncio.sleep(0.01)


def test_batches_that_arrive_during_a_commit_share_the_next_one(db: Database, gate: Gate) -> None:
    committer = GroupCommitter(db)
    committer.start()

    async def scenario() -> list[WriteResult]:
        first = asyncio.create_task(committer.write(valid(0, 1, range(0, 5))))
        await wait_entered(gate)
        rest = [asyncio.create_task(committer.write(valid(r, 1, range(0, 5)))) for r in (1, 2, 3)]
        rest.append(asyncio.create_task(committer.write(valid(1, 2, range(5, 10)))))
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in [first, *rest])  # nothing is acked before its commit
        gate.release.set()
        return await asyncio.gather(first, *rest)

    results = asyncio.run(scenario())
    committer.stop()
    assert [len(c) for c in gate.calls] == [1, 4]
    assert not any(r.duplicate for r in results)
    assert stored_steps(db) == 25
    with db.session() as session:
        job = session.scalars(select(Job).where(Job.job_id == "grouped")).one()
        assert (job.world_size, job.last_step) == (4, 9)
        agents = session.scalars(select(Agent).where(Agent.job_id == "grouped")).all()
        assert sorted(a.rank for a in agents) == [0, 1, 2, 3]
        assert {a.rank: a.first_step for a in agents} == {0: 0, 1: 0, 2: 0, 3: 0}


def test_a_writer_lingers_for_batches_that_arrive_just_after_the_first(db: Database) -> None:
    """Batches a fleet sends a few ms apart share one transaction when the writer lingers (the
    writer is idle when the first comes: without lingering it would go alone)."""
    committer = GroupCommitter(db, linger_seconds=1.0)
    committer.start()

    async def scenario() -> None:
        tasks = []
        for rank in range(4):
            tasks.append(asyncio.create_task(committer.write(valid(rank, 1, range(0, 5), job="linger"))))
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    committer.stop()
    assert committer.groups == 1
    assert stored_steps(db) == 20


def test_a_batch_sent_twice_in_one_group_is_stored_once(db: Database, gate: Gate) -> None:
    committer = GroupCommitter(db)
    committer.start()

    async def scenario() -> list[WriteResult]:
        blocker = asyncio.create_task(committer.write(valid(0, 1, range(0, 2))))
        await wait_entered(gate)
        twice = [asyncio.create_task(committer.write(valid(1, 1, range(0, 5)))) for _ in range(2)]
        gate.release.set()
        return await asyncio.gather(blocker, *twice)

    results = asyncio.run(scenario())
    committer.stop()
    assert [r.duplicate for r in results] == [False, False, True]
    assert stored_steps(db) == 7


def test_a_batch_the_database_refuses_fails_alone(db: Database, gate: Gate) -> None:
    committer = GroupCommitter(db)
    committer.start()

    async def scenario() -> list[Any]:
        blocker = asyncio.create_task(committer.write(valid(0, 1, range(0, 2))))
        await wait_entered(gate)
        group = [
            asyncio.create_task(committer.write(valid(1, 1, range(0, 5)))),
            asyncio.create_task(committer.write(valid(2, 1, range(0, 5), agent="poison"))),
            asyncio.create_task(committer.write(valid(3, 1, range(0, 5)))),
        ]
        gate.release.set()
        return await asyncio.gather(blocker, *group, return_exceptions=True)

    results = asyncio.run(scenario())
    committer.stop()
    assert [type(r).__name__ for r in results] == [
        "WriteResult",
        "WriteResult",
        "RuntimeError",
        "WriteResult",
    ]
    assert gate.calls[1] == ["agent-grouped-1/1", "poison/1", "agent-grouped-3/1"]  # the group, then alone
    assert stored_steps(db) == 12


def test_a_full_writer_holds_streams_back_and_asks_agents_to_throttle(db: Database, gate: Gate) -> None:
    committer = GroupCommitter(db, max_pending_records=8)
    committer.start()

    async def scenario() -> None:
        assert committer.throttle_seconds() == 0.0
        first = asyncio.create_task(committer.write(valid(0, 1, range(0, 5))))
        await wait_entered(gate)
        second = asyncio.create_task(committer.write(valid(1, 1, range(0, 5))))
        await asyncio.sleep(0.2)
        # 5 records wait to be written; 5 more would pass the limit of 8: the second stream's
        # batch is not taken in, and Acks now ask agents to hold back.
        assert not second.done()
        assert committer.throttle_seconds() > 0
        gate.release.set()
        await asyncio.gather(first, second)
        assert committer.throttle_seconds() == 0.0

    asyncio.run(scenario())
    committer.stop()
    assert [len(c) for c in gate.calls] == [1, 1]
    assert stored_steps(db) == 10


def test_records_stored_by_another_route_are_not_stored_twice(db: Database) -> None:
    # The same records under another agent id and seq (so not a resend the batch key catches):
    # the key on (job, step, rank, start) keeps one copy, and the new records beside them go in.
    write_batches(db, [valid(0, 1, range(0, 5))], now=f.T0)
    again = valid(0, 1, range(0, 8), agent="other-agent")
    [result] = write_batches(db, [again], now=f.T0)
    assert not result.duplicate
    assert stored_steps(db) == 8


def test_heartbeat_of_a_group_is_the_newest(db: Database) -> None:
    older = f.batch("hb", 0, 1, seq=2, heartbeat=pb.Heartbeat(time=f.T0 + 5, last_step=4, current_step=5))
    newer = f.batch("hb", 0, 1, seq=3, heartbeat=pb.Heartbeat(time=f.T0 + 9, last_step=8, current_step=9))
    store_batches(db, (newer, older), now=f.T0)
    with db.session() as session:
        agent = session.scalars(select(Agent).where(Agent.job_id == "hb")).one()
        assert agent.hb_current_step == 9


@pytest.fixture
def postgres_db_pair(postgres_admin_url: str) -> Iterator[tuple[Database, Database]]:
    """Two fresh, migrated PostgreSQL databases."""
    with (
        fresh_database(postgres_admin_url, "smon_test") as first,
        fresh_database(postgres_admin_url, "smon_test") as second,
    ):
        dbs = Database(first), Database(second)
        for database in dbs:
            migrate.upgrade(database)
        try:
            yield dbs
        finally:
            for database in dbs:
                database.dispose()


def rows_of(db: Database) -> tuple[list[Any], list[Any], list[Any]]:
    """The stored jobs, agents and step records, keys named by their natural keys (so two
    databases that stored the same batches compare equal)."""
    with db.session() as session:
        jobs = {j.key: (j.job_id, j.attempt) for j in session.scalars(select(Job))}
        agents = {a.key: a.agent_id for a in session.scalars(select(Agent))}
        job_rows = sorted(
            (j.job_id, j.attempt, j.world_size, j.last_step, j.last_seen, j.last_step_seen, j.first_seen)
            for j in session.scalars(select(Job))
        )
        agent_rows = sorted(
            (a.agent_id, a.job_id, a.attempt, a.rank, a.first_step, a.last_seen)
            for a in session.scalars(select(Agent))
        )
        steps = sorted(
            (jobs[r.job_key], agents[r.agent_key], r.rank, r.step, r.start_time, r.duration, bytes(r.spans))
            for r in session.scalars(select(StepRecord))
        )
    return job_rows, agent_rows, steps


@pytest.mark.postgres
def test_groups_of_known_jobs_store_what_the_first_path_stores(
    postgres_db_pair: tuple[Database, Database],
) -> None:
    # With every job and agent key remembered, a group writes its records before it upserts the
    # rows: the same rows as upserting first (the reference never remembers keys).
    fast, reference = postgres_db_pair
    reference.row_keys.lookup = lambda batches: None  # type: ignore[method-assign]
    groups = [[valid(rank, seq, range(5 * (seq - 1), 5 * seq)) for rank in range(4)] for seq in (1, 2, 3)]
    for i, group in enumerate(groups):
        for db in (fast, reference):
            write_batches(db, group, now=f.T0 + i)
    assert fast.row_keys.lookup(groups[-1]) is not None
    assert rows_of(fast) == rows_of(reference)
    assert rows_of(fast)[2] and len(rows_of(fast)[2]) == 4 * 15


@pytest.mark.postgres
def test_a_stale_remembered_key_undoes_the_group_and_it_is_stored_again(
    postgres_db_pair: tuple[Database, Database],
) -> None:
    db, _ = postgres_db_pair
    write_batches(db, [valid(0, 1, range(0, 5))], now=f.T0)
    known = db.row_keys.lookup([valid(0, 2, range(5, 10))])
    assert known is not None
    jobs, agents = known
    db.row_keys.remember({name: key + 1000 for name, key in jobs.items()}, agents)  # a row made anew
    # The job's span kind codes are remembered under the stale key too (else the group goes the
    # way of new names: its job rows upserted first, with their right keys, and nothing is stale).
    names = valid(0, 2, range(5, 10)).steps.kind_names
    for key in jobs.values():
        found = db.kinds.cached(key, names)
        assert found is not None
        db.kinds.remember({key + 1000: kinds.JobKinds(dict(found.codes))})
    with pytest.raises(row_keys.StaleRowKeys):
        write_batches(db, [valid(0, 2, range(5, 10))], now=f.T0)
    assert stored_steps(db) == 5  # the group's COPY was undone with it
    [result] = write_batches(db, [valid(0, 2, range(5, 10))], now=f.T0)  # keys forgotten: upserts first
    assert not result.duplicate
    assert rows_of(db)[2] == sorted(rows_of(db)[2]) and stored_steps(db) == 10
    assert db.row_keys.lookup([valid(0, 3, range(10, 12))]) == known


@pytest.mark.postgres
def test_two_writers_commit_one_jobs_groups_side_by_side(
    postgres_db_pair: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sixteen ranks of one job streaming at once through two writer threads: both commit groups,
    # every batch is acked once and stored once, and the job's row has the newest step.
    db, _ = postgres_db_pair
    threads: set[str] = set()
    both = threading.Barrier(2, timeout=10)

    def writing(db: Database, batches: Sequence[ValidBatch], now: float, **kwargs: Any) -> list[WriteResult]:
        if threading.current_thread().name not in threads:
            threads.add(threading.current_thread().name)
            both.wait()  # each writer's first group waits for the other's: they overlap
        return write_batches(db, batches, now, **kwargs)

    monkeypatch.setattr(commits, "write_batches", writing)
    ranks, per_rank = 16, 10
    steps = f.dp_job_steps(ranks, range(per_rank * 5))
    # Groups of at most two batches, and every batch sent at once, so the second writer has work
    # while the first one's group waits for it.
    committer = GroupCommitter(db, writers=2, max_group_records=10)
    committer.start()

    async def scenario() -> list[WriteResult]:
        batches = [
            f.batch("side", r, ranks, seq=seq, steps=steps[r][5 * (seq - 1) : 5 * seq])
            for seq in range(1, per_rank + 1)
            for r in range(ranks)
        ]
        return await asyncio.gather(*(committer.write(validate_batch(b, Limits())) for b in batches))

    results = asyncio.run(scenario())
    committer.stop()
    assert len(threads) == 2
    assert len(results) == ranks * per_rank and not any(r.duplicate for r in results)
    assert stored_steps(db) == ranks * per_rank * 5
    with db.session() as session:
        job = session.scalars(select(Job).where(Job.job_id == "side")).one()
        assert job.last_step == per_rank * 5 - 1
        assert session.scalar(select(func.count()).select_from(Agent)) == ranks


@pytest.mark.postgres
def test_a_stale_remembered_key_of_a_job_with_new_names_is_put_right(
    postgres_db_pair: tuple[Database, Database],
) -> None:
    """A group whose job's span kinds are not cached upserts its job rows first: a remembered key
    that went stale is replaced by the stored one, and the records go under it."""
    db, _ = postgres_db_pair
    write_batches(db, [valid(0, 1, range(0, 5))], now=f.T0)
    known = db.row_keys.lookup([valid(0, 2, range(5, 10))])
    assert known is not None
    jobs, agents = known
    db.row_keys.remember({name: key + 1000 for name, key in jobs.items()}, agents)
    [result] = write_batches(db, [valid(0, 2, range(5, 10))], now=f.T0)
    assert not result.duplicate and stored_steps(db) == 10
    assert db.row_keys.lookup([valid(0, 3, range(10, 12))]) == known


def test_a_batch_withdrawn_before_a_writer_takes_it_is_never_stored(db: Database, gate: Gate) -> None:
    # Room for both batches, and Acks ask agents to hold back while half of it is still taken.
    committer = GroupCommitter(db, max_pending_records=10)
    committer.start()

    async def scenario() -> WriteResult:
        first = asyncio.create_task(committer.write(valid(0, 1, range(0, 5))))
        await wait_entered(gate)  # the writer holds the first batch
        late = asyncio.create_task(committer.write(valid(1, 1, range(0, 5))))
        await asyncio.sleep(0.05)
        late.cancel()  # its stream ended while it waited in the queue
        with pytest.raises(asyncio.CancelledError):
            await late
        gate.release.set()
        return await first

    asyncio.run(scenario())
    committer.stop()
    assert gate.calls == [[f"{valid(0, 1, range(0, 5)).agent_id}/1"]]  # the late one never written
    assert stored_steps(db) == 5
    assert committer.throttle_seconds() == 0.0  # the withdrawn batch's records were let go too


def test_a_batch_a_writer_holds_reports_its_outcome_to_a_caller_that_stops_waiting(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Asked once to stop, the caller still learns whether its batch was stored (a stream acks
    it before it ends); asked twice, it gives up, and the outcome is read all the same: no
    'Future exception was never retrieved' from asyncio."""
    entered, release = threading.Event(), threading.Event()

    def held(db: Database, batches: Sequence[ValidBatch], now: float, **kwargs: Any) -> list[WriteResult]:
        entered.set()
        release.wait(10)
        if any(b.agent_id == "poison" for b in batches):
            raise sa_exc.OperationalError("COPY", {}, psycopg.OperationalError("the database went away"))
        return write_batches(db, batches, now, **kwargs)

    monkeypatch.setattr(commits, "write_batches", held)
    committer = GroupCommitter(db)
    committer.start()

    async def in_writer(task: asyncio.Task[WriteResult]) -> None:
        while not entered.is_set():
            await asyncio.sleep(0.01)
        entered.clear()

    async def scenario() -> WriteResult:
        kept = asyncio.create_task(committer.write(valid(0, 1, range(0, 5))))
        await in_writer(kept)
        kept.cancel()
        await asyncio.sleep(0.05)
        release.set()
        result = await kept  # not cancelled: the writer had it
        release.clear()
        poisoned = asyncio.create_task(committer.write(valid(1, 1, range(0, 5), agent="poison")))
        await in_writer(poisoned)
        poisoned.cancel()
        await asyncio.sleep(0.01)
        poisoned.cancel()  # gives up: the writer's failure will have nobody waiting for it
        with pytest.raises(asyncio.CancelledError):
            await poisoned
        release.set()
        await asyncio.sleep(0.3)  # the failure is settled on this loop
        return result

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        result = asyncio.run(scenario())
        committer.stop()  # the writer lets go of its last group
        gc.collect()
    assert not result.duplicate and stored_steps(db) == 5
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_database_away_fails_the_group_at_once_with_one_line_for_the_outage(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    away = threading.Event()
    away.set()
    calls: list[int] = []

    def flaky(db: Database, batches: Sequence[ValidBatch], now: float, **kwargs: Any) -> list[WriteResult]:
        calls.append(len(batches))
        if away.is_set():
            cause = psycopg.OperationalError("server closed the connection")
            raise sa_exc.OperationalError("COPY", {}, cause)
        return write_batches(db, batches, now, **kwargs)

    monkeypatch.setattr(commits, "write_batches", flaky)
    committer = GroupCommitter(db)
    committer.start()

    async def scenario() -> list[WriteResult | BaseException]:
        tasks = [asyncio.create_task(committer.write(valid(r, 1, range(0, 5)))) for r in range(4)]
        failed = await asyncio.gather(*tasks, return_exceptions=True)
        away.clear()
        stored = await committer.write(valid(0, 2, range(5, 10)))
        return [*failed, stored]

    with caplog.at_level(logging.INFO):
        outcomes = asyncio.run(scenario())
    committer.stop()
    assert all(isinstance(o, sa_exc.OperationalError) for o in outcomes[:4])
    assert isinstance(outcomes[4], WriteResult)
    assert sum(calls[:-1]) == 4  # each batch tried once: no retry one by one while it is away
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(":")[0].split(" after")[0] for r in lines] == [
        "database unavailable",
        "database available again",
    ]
    assert "server closed the connection" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


def test_a_hosts_batches_share_one_group_and_each_gets_its_own_outcome(db: Database, gate: Gate) -> None:
    """write_many (a host relay's message): its parts go to a writer together, and each part's
    outcome comes back in part order: stored, stored again (a duplicate), refused alone."""
    committer = GroupCommitter(db)
    committer.start()

    async def scenario() -> list[WriteResult | BaseException]:
        blocker = asyncio.create_task(committer.write(valid(0, 1, range(0, 2))))
        await wait_entered(gate)
        parts = [
            valid(1, 1, range(0, 5)),
            valid(2, 1, range(0, 5), agent="poison"),
            valid(1, 1, range(0, 5)),
            valid(3, 1, range(0, 5)),
        ]
        host = asyncio.create_task(committer.write_many(parts))
        await asyncio.sleep(0.1)
        assert not host.done()  # nothing is answered before its commit
        gate.release.set()
        await blocker
        return await host

    results = asyncio.run(scenario())
    committer.stop()
    assert [type(r).__name__ for r in results] == [
        "WriteResult",
        "RuntimeError",
        "WriteResult",
        "WriteResult",
    ]
    stored = [r for r in results if isinstance(r, WriteResult)]
    assert [r.duplicate for r in stored] == [False, True, False]
    assert gate.calls[1] == ["agent-grouped-1/1", "poison/1", "agent-grouped-1/1", "agent-grouped-3/1"]
    assert stored_steps(db) == 12


def test_a_hosts_message_withdrawn_or_held_when_its_stream_ends(db: Database, gate: Gate) -> None:
    """Cancelled while queued, a host's message is withdrawn whole (never stored); cancelled while
    a writer holds it, it still returns each part's outcome, so the stream can ack them."""
    committer = GroupCommitter(db)
    committer.start()

    async def scenario() -> list[WriteResult | BaseException]:
        held = asyncio.create_task(committer.write_many([valid(0, 1, range(0, 5)), valid(1, 1, range(0, 5))]))
        await wait_entered(gate)  # the writer holds the first message
        queued = asyncio.create_task(
            committer.write_many([valid(2, 1, range(0, 5)), valid(3, 1, range(0, 5))])
        )
        await asyncio.sleep(0.05)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        held.cancel()
        await asyncio.sleep(0.05)
        gate.release.set()
        return await held

    results = asyncio.run(scenario())
    committer.stop()
    assert [type(r).__name__ for r in results] == ["WriteResult", "WriteResult"]
    assert gate.calls == [["agent-grouped-0/1", "agent-grouped-1/1"]]  # the queued one never written
    assert stored_steps(db) == 10
    assert committer.throttle_seconds() == 0.0
