"""Replicas divide the jobs: each job has one replica, the shares are even by weight, and a change
of replicas moves few jobs (jobs/affinity.py); the live replicas are the membership locks
PostgreSQL holds (store/replicas.py)."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import create_engine, text

from smon_server.context import ServerContext
from smon_server.jobs import loop
from smon_server.jobs.affinity import SLACK, Work, assign
from smon_server.store import migrate
from smon_server.store.replicas import REPLICA_LOCK_CLASS, Membership
from tests.support import factories as f
from tests.support.databases import fresh_database
from tests.support.settings import server_settings
from tests.support.stored import store_batches


def fleet(n: int, seed: int = 1) -> list[Work]:
    rng = random.Random(seed)
    return [Work(f"job-{i:04d}#1", float(rng.choice([8, 16, 64, 64, 128, 1024]))) for i in range(n)]


def loads(work: list[Work], owners: dict[str, int]) -> dict[int, float]:
    weight = {w.name: w.weight for w in work}
    out: dict[int, float] = {}
    for name, r in owners.items():
        out[r] = out.get(r, 0.0) + weight[name]
    return out


@pytest.mark.parametrize("replicas", [[11, 22], [11, 22, 33], [5, 6, 7, 8, 9]])
def test_every_job_has_one_replica_and_the_shares_are_even(replicas: list[int]) -> None:
    work = fleet(500)
    owners = assign(work, replicas)
    assert set(owners) == {w.name for w in work} and set(owners.values()) == set(replicas)
    share = sum(w.weight for w in work) / len(replicas)
    for r, load in loads(work, owners).items():
        assert load <= (1 + SLACK) * share, (r, load, share)
        assert load >= (1 - 2 * SLACK) * share, (r, load, share)


def test_every_replica_computes_the_same_assignment_whatever_the_order() -> None:
    work = fleet(200)
    shuffled = list(work)
    random.Random(3).shuffle(shuffled)
    assert assign(work, [3, 1, 2]) == assign(shuffled, [1, 2, 3])


def test_a_replica_that_leaves_hands_on_its_jobs_and_the_others_keep_theirs() -> None:
    work = fleet(400)
    before = assign(work, [1, 2, 3])
    after = assign(work, [1, 3])
    kept = [n for n, r in before.items() if r != 2]
    moved = sum(after[n] != before[n] for n in kept)
    assert all(after[n] in (1, 3) for n in before)
    assert moved <= 0.15 * len(kept), f"{moved} of {len(kept)} jobs moved between surviving replicas"


def test_a_replica_that_joins_takes_about_its_share() -> None:
    work = fleet(400)
    before = assign(work, [1, 2])
    after = assign(work, [1, 2, 3])
    moved = [n for n in before if after[n] != before[n]]
    assert all(after[n] == 3 for n in moved) or len(moved) <= 0.45 * len(work)
    assert 0.2 * len(work) <= sum(r == 3 for r in after.values()) <= 0.5 * len(work)


def test_a_job_bigger_than_a_share_still_has_a_replica() -> None:
    work = [Work("huge#1", 16384.0), Work("small#1", 8.0), Work("small#2", 8.0)]
    owners = assign(work, [1, 2])
    assert set(owners) == {"huge#1", "small#1", "small#2"}
    assert assign(work, []) == {}
    assert assign(work, [7]) == dict.fromkeys(owners, 7)


@pytest.mark.postgres
def test_live_replicas_are_the_membership_locks_postgres_holds(postgres_url: str) -> None:
    engines = [create_engine(postgres_url) for _ in range(3)]
    members = [Membership(e) for e in engines]
    try:
        first = members[0].live()
        assert first == [members[0].key]
        for m in members[1:]:
            m.live()  # joins
        everyone = sorted(m.key for m in members)
        assert members[0].live() == everyone == members[2].live()
        members[1].leave()  # a replica that exits: gone from the set at once
        assert members[0].live() == sorted([members[0].key, members[2].key])
        engines[2].dispose()  # its connection is checked out: the lock outlives a pool dispose
        assert members[2].key in members[0].live()
    finally:
        for m in members:
            m.leave()
        for e in engines:
            e.dispose()


def test_the_embedded_database_has_one_replica() -> None:
    engine = create_engine("sqlite://")
    member = Membership(engine)
    assert member.live() == [member.key]


@pytest.mark.postgres
def test_two_replicas_share_the_jobs_keep_them_and_take_over_when_one_leaves(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two server contexts on one database (two replicas' analysis loops): each job is analysed
    by one of them pass after pass (its window cache stays useful), both have a share, and the
    jobs of one that leaves go to the other at its next pass."""
    contexts = [
        ServerContext.from_settings(server_settings(postgres_url, analysis_workers=0)) for _ in range(2)
    ]
    migrate.upgrade(contexts[0].db)
    jobs = [f.new_job_id(f"share{i}") for i in range(8)]
    analysed: dict[str, list[int]] = {job: [] for job in jobs}
    real = loop.analyse_one

    def recording(context: loop.LoopContext, job_id: str, now: float, *, attempt: int | None = None) -> bool:
        done = real(context, job_id, now, attempt=attempt)
        if done:
            analysed[job_id].append(next(i for i, c in enumerate(contexts) if c is context))
        return done

    monkeypatch.setattr(loop, "analyse_one", recording)

    def store(steps: range, t: float) -> None:
        batches = []
        for job in jobs:
            records = f.dp_job_steps(2, steps, origin=f.T0)
            batches += [f.batch(job, r, 2, steps=records[r], seq=steps.start + 1) for r in range(2)]
        store_batches(contexts[0].db, batches, now=t)

    try:
        for context in contexts:  # both replicas up (one started alone would take every job first)
            context.membership.live()
        t = f.T0 + 10
        for round_ in range(3):
            store(range(round_ * 5, round_ * 5 + 5), t)
            t += 2
            for context in contexts:  # both replicas' passes, each after new steps
                loop.analysis_pass(context, t)
            t += 1
        assert all(len(by) == 3 for by in analysed.values()), analysed  # analysed at every round
        owners = {job: set(by) for job, by in analysed.items()}
        assert all(len(r) == 1 for r in owners.values()), f"a job moved between replicas: {owners}"
        per_replica = [sum(r == {i} for r in owners.values()) for i in range(2)]
        room = (1 + SLACK) * len(jobs) / 2
        assert all(0 < n <= room for n in per_replica), per_replica
        assert [c.analysis_stats.jobs_assigned._value.get() for c in contexts] == per_replica
        assert contexts[0].analysis_stats.replicas._value.get() == 2

        contexts[1].close()  # the second replica stops: its lock goes with it
        store(range(15, 20), t)
        for job in jobs:
            analysed[job] = []
        loop.analysis_pass(contexts[0], t + 2)
        assert all(analysed[job] == [0] for job in jobs), analysed
        assert contexts[0].analysis_stats.replicas._value.get() == 1
    finally:
        for context in contexts:
            context.close()


@pytest.mark.postgres
def test_replicas_of_another_database_on_the_same_server_are_not_counted(
    postgres_url: str, postgres_admin_url: str
) -> None:
    with fresh_database(postgres_admin_url, "smon_other") as other_url:
        engines = [create_engine(postgres_url), create_engine(other_url)]
        members = [Membership(e) for e in engines]
        try:
            assert [m.live() for m in members] == [[members[0].key], [members[1].key]]
        finally:
            for m in members:
                m.leave()
            for e in engines:
                e.dispose()


@pytest.mark.postgres
def test_a_membership_whose_connection_was_cut_joins_again_in_the_same_call(postgres_url: str) -> None:
    """After an outage the kept connection is dead: the next pass must find the replicas, not
    fail (and log a second outage) for a stale connection."""
    engine = create_engine(postgres_url)
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    member = Membership(engine)
    try:
        first = member.live()
        with admin.connect() as connection:
            cut = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND classid = :cls AND objid = :key"
                ),
                {"cls": REPLICA_LOCK_CLASS, "key": first[0]},
            ).scalar()
        assert cut == 1
        again = member.live()
        assert again == [member.key] and member.key != 0
    finally:
        member.leave()
        engine.dispose()
        admin.dispose()
