"""Group commit: batches of many streams share a transaction, each is acked after its commit, a
bad batch fails alone, and the writer pushes back when it falls behind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import func, select

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest import commits
from smon_server.ingest.commits import GroupCommitter
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store.db import Database
from smon_server.store.models import Agent, Job, StepRecord
from smon_server.store.rows import ValidBatch
from smon_server.store.writes import WriteResult, write_batches
from tests import factories as f

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
        self, db: Database, batches: Sequence[ValidBatch], now: float, **options: float
    ) -> list[WriteResult]:
        self.calls.append([f"{b.agent_id}/{b.seq}" for b in batches])
        if len(self.calls) == 1:
            self.entered.set()
            self.release.wait(10)
        if any(b.agent_id == "poison" for b in batches):
            raise RuntimeError("the database refused this batch")
        return write_batches(db, batches, now, **options)


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
        assert committer.pending_records == 5
        assert not second.done()
        assert committer.throttle_seconds() > 0
        gate.release.set()
        await asyncio.gather(first, second)
        assert committer.pending_records == 0
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
    write_batches(db, [validate_batch(b, Limits()) for b in (newer, older)], now=f.T0)
    with db.session() as session:
        agent = session.scalars(select(Agent).where(Agent.job_id == "hb")).one()
        assert agent.hb_current_step == 9
