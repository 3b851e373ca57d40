"""Which attempt a batch goes to (store/attempts.py), through the real write path on both databases:
a resubmission or an elastic restart opens a new attempt, a rank restarted inside a running one
does not, a late batch of an old run stays in it, and two writers deciding at once agree."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event, select

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store import queries
from smon_server.store.db import Database
from smon_server.store.models import Agent, Job, StepRecord
from smon_server.store.writes import write_batches
from tests.support import factories as f

WORLD = 2
STALL = 120.0
T = f.T0 + 1000.0  # the server's clock in these tests


def send(
    db: Database,
    job: str,
    agent: str,
    rank: int,
    *,
    now: float,
    seq: int = 1,
    steps: range = range(0),
    reported: int | None = None,
    final: bool = False,
) -> None:
    records = f.dp_job_steps(WORLD, steps, origin=now - 10)[rank] if len(steps) else []
    batch = f.batch(job, rank, WORLD, seq=seq, steps=records, agent_id=agent, final=final)
    batch.heartbeat.CopyFrom(pb.Heartbeat(time=now, last_step=-1, current_step=0))
    if reported is not None:
        batch.coords.attempt = reported
    write_batches(db, [validate_batch(batch, Limits())], now=now, stall_seconds=STALL)


def attempt_of(db: Database, agent: str) -> int:
    with db.session() as s:
        found = s.scalar(select(Agent.attempt).where(Agent.agent_id == agent))
        assert found is not None, f"agent {agent} was not stored"
        return int(found)


def attempts(db: Database, job: str) -> dict[int, int | None]:
    """attempt -> the identity its agents reported."""
    with db.session() as s:
        return {
            int(a): r
            for a, r in s.execute(select(Job.attempt, Job.reported_attempt).where(Job.job_id == job))
        }


def start(db: Database, job: str, *, now: float = T, reported: int | None = None, prefix: str = "a") -> None:
    for rank in range(WORLD):
        send(db, job, f"{prefix}{rank}", rank, now=now, steps=range(0, 5), reported=reported)


def test_a_job_resubmitted_after_every_agent_said_goodbye_is_a_new_attempt(db: Database) -> None:
    start(db, "resubmitted")
    for rank in range(WORLD):
        send(db, "resubmitted", f"a{rank}", rank, now=T + 5, seq=2, final=True)
    # Seconds later, the same job id again, its steps from 0: not the old run.
    for rank in range(WORLD):
        send(db, "resubmitted", f"b{rank}", rank, now=T + 8, steps=range(0, 5))
    assert attempts(db, "resubmitted") == {1: None, 2: None}
    assert [attempt_of(db, f"b{r}") for r in range(WORLD)] == [2, 2]
    with db.session() as s:
        keys = {
            int(a): int(k)
            for a, k in s.execute(select(Job.attempt, Job.key).where(Job.job_id == "resubmitted"))
        }
        stored = {
            a: s.scalars(
                select(StepRecord.step).where(StepRecord.job_key == k).order_by(StepRecord.step)
            ).all()
            for a, k in keys.items()
        }
        newest = queries.get_job(session=s, job_id="resubmitted")
        assert newest is not None and newest.attempt == 2
    # Each attempt holds its own five steps of each rank, step numbers and all.
    assert stored == {1: sorted([*range(5)] * WORLD), 2: sorted([*range(5)] * WORLD)}


def test_a_short_run_whose_first_rank_finished_before_the_last_one_reported_is_one_attempt(
    db: Database,
) -> None:
    """Rank 0 ran, flushed and said goodbye before rank 1's shipper sent anything: rank 1 is the
    same run (its rank was missing), not a resubmission."""
    send(db, "short", "a0", 0, now=T, steps=range(0, 5))
    send(db, "short", "a0", 0, now=T + 1, seq=2, final=True)
    send(db, "short", "a1", 1, now=T + 2, steps=range(0, 5))
    assert attempts(db, "short") == {1: None}
    assert attempt_of(db, "a1") == 1
    # once every rank has reported and gone, the same job id again is a new run
    send(db, "short", "a1", 1, now=T + 3, seq=2, final=True)
    send(db, "short", "b0", 0, now=T + 4, steps=range(0, 5))
    assert attempt_of(db, "b0") == 2


def test_a_job_resubmitted_after_its_agents_went_silent_is_a_new_attempt(db: Database) -> None:
    start(db, "crashed")  # killed: no goodbye
    send(db, "crashed", "b0", 0, now=T + STALL + 1, steps=range(0, 3))
    assert attempt_of(db, "b0") == 2
    send(db, "crashed", "b1", 1, now=T + STALL + 2, steps=range(0, 3))
    assert attempt_of(db, "b1") == 2  # the new run is alive now: its other ranks join it


def test_a_rank_restarted_inside_a_running_attempt_stays_in_it(db: Database) -> None:
    start(db, "one-rank")
    send(db, "one-rank", "a1-again", 1, now=T + 30, steps=range(3, 6))  # rank 1 came back
    assert attempt_of(db, "a1-again") == 1 and attempts(db, "one-rank") == {1: None}
    start(db, "one-rank-counted", reported=0, prefix="c")
    send(db, "one-rank-counted", "c1-again", 1, now=T + 30, steps=range(3, 6), reported=0)
    assert attempt_of(db, "c1-again") == 1 and attempts(db, "one-rank-counted") == {1: 0}


def test_a_larger_restart_count_opens_a_new_attempt_and_late_batches_stay_in_the_old(db: Database) -> None:
    start(db, "elastic", reported=0)
    # torchrun killed the workers a moment ago (they are not silent long yet) and started new ones.
    for rank in range(WORLD):
        send(db, "elastic", f"r{rank}", rank, now=T + 3, steps=range(0, 4), reported=1)
    assert attempts(db, "elastic") == {1: 0, 2: 1}
    assert [attempt_of(db, f"r{r}") for r in range(WORLD)] == [2, 2]
    # The old run's last records, flushed by its shipper after the restart: they stay in attempt 1.
    send(db, "elastic", "a0", 0, now=T + 4, seq=2, steps=range(5, 7), reported=0)
    assert attempt_of(db, "a0") == 1
    with db.session() as s:
        first = queries.get_job(session=s, job_id="elastic", attempt=1)
        second = queries.get_job(session=s, job_id="elastic", attempt=2)
        assert first is not None and second is not None
        assert (first.last_step, second.last_step) == (6, 3)
        # An agent of the old run whose first batch comes only now joins the old run, still live.
    send(db, "elastic", "a-late", 1, now=T + 5, steps=range(5, 6), reported=0)
    assert attempt_of(db, "a-late") == 1


def test_a_resubmission_whose_count_starts_again_opens_a_new_attempt(db: Database) -> None:
    start(db, "recount", reported=0)
    for rank in range(WORLD):
        send(db, "recount", f"r{rank}", rank, now=T + 3, steps=range(0, 4), reported=1)
    # Resubmitted while the restarted run's agents were last heard moments ago: torchrun counts
    # from 0 again, and attempt 1 (which reported 0) is long gone.
    send(db, "recount", "n0", 0, now=T + STALL + 2, steps=range(0, 2), reported=0)
    assert attempt_of(db, "n0") == 3
    send(db, "recount", "n1", 1, now=T + STALL + 2.5, steps=range(0, 2), reported=0)
    assert attempt_of(db, "n1") == 3 and attempts(db, "recount") == {1: 0, 2: 1, 3: 0}


def test_an_agent_without_the_field_joins_a_reported_attempt(db: Database) -> None:
    start(db, "mixed", reported=4)
    send(db, "mixed", "old-agent", 1, now=T + 1, steps=range(5, 6))
    assert attempt_of(db, "old-agent") == 1 and attempts(db, "mixed") == {1: 4}


def test_a_resubmission_in_one_group_opens_one_attempt(db: Database) -> None:
    start(db, "grouped")
    for rank in range(WORLD):
        send(db, "grouped", f"a{rank}", rank, now=T + 1, seq=2, final=True)
    batches = []
    for rank in range(WORLD):
        records = f.dp_job_steps(WORLD, range(0, 3), origin=T)[rank]
        batches.append(
            validate_batch(f.batch("grouped", rank, WORLD, steps=records, agent_id=f"g{rank}"), Limits())
        )
    write_batches(db, batches, now=T + 2, stall_seconds=STALL)
    assert [attempt_of(db, f"g{r}") for r in range(WORLD)] == [2, 2]
    assert attempts(db, "grouped") == {1: None, 2: None}


def _new_agent(
    gate: threading.Barrier,
    failures: list[BaseException],
    replica: Database,
    job: str,
    agent: str,
    rank: int,
    reported: int,
) -> None:
    try:
        gate.wait(5)
        send(replica, job, agent, rank, now=T + 3, steps=range(0, 2), reported=reported)
    except BaseException as exc:  # surfaced by the test
        failures.append(exc)


@pytest.mark.postgres
def test_two_writers_deciding_at_once_agree(postgres_url: str) -> None:
    """Two server replicas (two databases objects: two caches, two connection pools) store the
    first batches of one restarted job's new agents at the same moment, many times over. Agents
    of one new run land in one attempt; two runs reported at once never share one."""
    from smon_server.store import migrate

    replicas = [Database(postgres_url), Database(postgres_url)]
    migrate.upgrade(replicas[0])
    try:
        for round_ in range(12):
            job = f"race-{round_}"
            start(replicas[0], job, reported=0, prefix=f"{job}-a")
            gate = threading.Barrier(2)
            failures: list[BaseException] = []
            # Even rounds: both ranks of one restarted run, one on each replica. Odd rounds: two
            # restarts reported at once (counts 1 and 2), as if one came right after the other.
            reported = (1, 1) if round_ % 2 == 0 else (1, 2)
            threads = [
                threading.Thread(
                    target=_new_agent, args=(gate, failures, replicas[i], job, f"{job}-n{i}", i, reported[i])
                )
                for i in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not failures, failures
            placed = [attempt_of(replicas[0], f"{job}-n{i}") for i in range(2)]
            if reported[0] == reported[1]:
                assert placed == [2, 2] and attempts(replicas[0], job) == {1: 0, 2: 1}
            else:
                assert sorted(placed) == [2, 3], placed
                assert sorted(attempts(replicas[0], job).items()) in (
                    [(1, 0), (2, 1), (3, 2)],
                    [(1, 0), (2, 2), (3, 1)],
                )
    finally:
        for r in replicas:
            r.dispose()


def test_deciding_a_new_agents_attempt_reads_rows_for_its_group_not_for_every_agent_of_the_job(
    db: Database,
) -> None:
    """While a big job starts, every group with a new agent decides here: reading all the job's
    stored agents each time made a 16,384-rank start quadratic. Still right on both paths: a
    rank joining a live attempt, and the last rank of a run whose other ranks all said goodbye."""
    world = 300
    batches = []
    for rank in range(world - 1):
        b = f.batch("wide", rank, world, agent_id=f"w{rank}")
        b.heartbeat.CopyFrom(pb.Heartbeat(time=T, last_step=-1, current_step=0))
        batches.append(validate_batch(b, Limits()))
    write_batches(db, batches, now=T, stall_seconds=STALL)
    rows: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            rows.append(max(cursor.rowcount, 0))

    sent = []
    for agent, now, final in (("late", T + 1, False), ("last", T + 3, False)):
        if agent == "last":  # every other rank said goodbye: the attempt is not live any more
            goodbyes = []
            for rank in range(world - 1):
                b = f.batch("wide", rank, world, seq=2, agent_id=f"w{rank}", final=True)
                b.heartbeat.CopyFrom(pb.Heartbeat(time=T + 2, last_step=-1, current_step=0))
                goodbyes.append(validate_batch(b, Limits()))
            goodbyes.append(
                validate_batch(
                    f.batch("wide", world - 1, world, seq=2, agent_id="late", final=True), Limits()
                )
            )
            write_batches(db, goodbyes, now=T + 2, stall_seconds=STALL)
        rank = world - 1 if agent == "late" else 0
        b = f.batch("wide", rank, world, agent_id=agent, final=final)
        b.heartbeat.CopyFrom(pb.Heartbeat(time=now, last_step=-1, current_step=0))
        rows.clear()
        event.listen(db.engine, "after_cursor_execute", count)
        try:
            write_batches(db, [validate_batch(b, Limits())], now=now, stall_seconds=STALL)
        finally:
            event.remove(db.engine, "after_cursor_execute", count)
        sent.append(sum(rows))
    assert attempt_of(db, "late") == 1  # joined the live attempt
    # rank 0 of a finished run whose every rank reported: a resubmission
    assert attempt_of(db, "last") == 2
    if db.is_postgres:  # rows a SELECT returned: sqlite3 reports none (-1)
        assert max(sent) < world // 10, sent  # rows read by each decision (all 300 agents: >= 300)
