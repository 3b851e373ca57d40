"""Which worker keeps which job and how many workers analyse (jobs/worker_shares.py): a spare worker
taken while passes near the interval and given back once they keep up, jobs moved to even the
workers out no faster than their cold passes fit, and what no longer runs weighs nothing."""

from __future__ import annotations

import random

import pytest

from smon_server.jobs.worker_shares import (
    BALANCED,
    COLD_FACTOR,
    GROW_AT,
    MOVE_BUDGET,
    QUIET_PASSES,
    RECENT_PASSES,
    SHRINK_AT,
    JobKey,
    WorkerShares,
)

INTERVAL = 10.0


def jobs(n: int, prefix: str = "job") -> list[JobKey]:
    return [(f"{prefix}-{i}", 1) for i in range(n)]


def run_pass(shares: WorkerShares, costs: dict[JobKey, float], *, cold: float = COLD_FACTOR) -> list[float]:
    """One pass: every job analysed on its worker, a job that moved since its last pass (or is new
    to its worker) costing `cold` times its warm cost. Returns each active worker's busy seconds."""
    busy = [0.0] * shares.active
    for job, warm in costs.items():
        slot = shares.slot(job)
        seconds = warm * cold if LAST_SLOT.get(job, slot) != slot else warm
        LAST_SLOT[job] = slot
        shares.ran(job, slot, seconds)
        busy[slot] += seconds
    return busy


LAST_SLOT: dict[JobKey, int] = {}  # where run_pass last analysed each job


@pytest.fixture(autouse=True)
def fresh_slots() -> None:
    LAST_SLOT.clear()


def test_without_a_spare_the_workers_stay_as_many_and_jobs_spread_by_cost() -> None:
    shares = WorkerShares(2)
    heavy, light = ("big", 1), jobs(4)
    shares.ran(heavy, shares.slot(heavy), 3.0)  # a costly job on worker 0
    shares.ran(light[0], shares.slot(light[0]), 0.5)  # a cheap one on worker 1
    for job in light[1:]:
        shares.slot(job)  # not analysed yet: each weighs the mean of those that were
    assert [shares.owner[j] for j in light] == [1, 1, 1, 0]  # each new job to the least loaded
    for _ in range(3):
        run_pass(shares, {heavy: 9.0, **dict.fromkeys(light, 0.5)})
        change = shares.adapt(INTERVAL)
        assert not change.grown and change.retired is None
    assert shares.active == 2
    # The light job that shared the heavy one's worker moved to the other; the heavy one stays.
    assert shares.owner[heavy] == 0 and {shares.owner[j] for j in light} == {1}


def test_a_pass_near_the_interval_takes_the_spare_and_moves_jobs_no_faster_than_their_cold_passes_fit() -> (
    None
):
    shares = WorkerShares(1, spare=1)
    costs = dict.fromkeys(jobs(500), 0.024)  # 12 s on one worker: past the interval
    before = max(run_pass(shares, costs))
    assert before > GROW_AT * INTERVAL
    change = shares.adapt(INTERVAL)
    assert change.grown and shares.active == 2
    moved = change.moved[0]
    assert 0 < len(moved) * 0.024 * COLD_FACTOR <= MOVE_BUDGET * INTERVAL
    assert all(shares.owner[j] == 1 for j in moved)
    passes = [before]
    for _ in range(20):
        busy = run_pass(shares, costs)
        passes.append(max(busy))
        change = shares.adapt(INTERVAL)
        assert not change.grown and change.retired is None
        if not change.moved:
            break
    else:
        pytest.fail("the jobs never settled")
    # No pass while the jobs moved was slower than the pass without the spare, and settled, the
    # two workers share the work evenly (within BALANCED, and a job).
    assert max(passes) <= before + 1e-9
    loads = shares.loads()
    assert abs(loads[0] - loads[1]) <= BALANCED * max(loads) + 0.024 + 1e-9
    steady = max(run_pass(shares, costs))  # the moved jobs' cold passes behind them
    assert 6.0 <= steady <= 6.0 * (1 + BALANCED / 2) + 0.024
    assert not shares.adapt(INTERVAL).moved


def test_the_spare_is_given_back_only_after_passes_in_a_row_that_fit_one_worker_fewer() -> None:
    shares = WorkerShares(1, spare=1)
    busy_costs = dict.fromkeys(jobs(40), 0.25)  # 10 s
    run_pass(shares, busy_costs)
    assert shares.adapt(INTERVAL).grown
    quiet_costs = dict.fromkeys(jobs(40), 0.05)  # 2 s in all: fits one worker within SHRINK_AT
    assert sum(quiet_costs.values()) < SHRINK_AT * INTERVAL
    for _ in range(QUIET_PASSES - 2):
        run_pass(shares, quiet_costs)
        assert shares.adapt(INTERVAL).retired is None
    run_pass(shares, busy_costs)  # one busy pass in between starts the count again
    shares.adapt(INTERVAL)
    for _ in range(QUIET_PASSES - 1):
        run_pass(shares, quiet_costs)
        assert shares.adapt(INTERVAL).retired is None
    on_spare = {j for j, s in shares.owner.items() if s == 1}
    assert on_spare
    run_pass(shares, quiet_costs)
    change = shares.adapt(INTERVAL)
    assert change.retired == 1 and shares.active == 1
    assert set(change.moved[1]) == on_spare
    assert all(shares.slot(j) == 0 for j in quiet_costs)  # back on the base worker


def test_jobs_that_no_longer_run_weigh_nothing_and_are_not_moved() -> None:
    shares = WorkerShares(1, spare=1)
    finished = dict.fromkeys(jobs(400, "done"), 0.025)  # 10 s, then never analysed again
    run_pass(shares, finished)
    assert shares.adapt(INTERVAL).grown
    live = dict.fromkeys(jobs(20, "live"), 0.05)
    moved: set[JobKey] = set()
    for i in range(RECENT_PASSES + QUIET_PASSES + 1):
        run_pass(shares, live)
        change = shares.adapt(INTERVAL)
        if i >= RECENT_PASSES and change.retired is None:
            moved |= {j for m in change.moved.values() for j in m}
            assert shares.loads() == pytest.approx(
                [sum(c for j, c in live.items() if shares.owner[j] == s) for s in range(shares.active)]
            )
    assert not moved & set(finished)
    assert shares.active == 1  # the finished jobs' old costs did not keep the spare


def test_forgotten_jobs_leave_the_shares_those_of_a_given_back_worker_too() -> None:
    shares = WorkerShares(2)
    a, b = jobs(2)
    shares.ran(a, shares.slot(a), 1.0)
    shares.ran(b, shares.slot(b), 1.0)
    shares.forget({b})
    assert set(shares.owner) == {b} and set(shares.cost) == {b} and set(shares.last_ran) == {b}
    spare = WorkerShares(1, spare=1)
    finished = dict.fromkeys(jobs(100, "done"), 0.1)
    run_pass(spare, finished)
    assert spare.adapt(INTERVAL).grown
    run_pass(spare, finished)
    spare.adapt(INTERVAL)
    assert spare.adapt(INTERVAL, spare_ok=False).retired == 1  # its jobs unplaced until they run
    spare.forget(set())
    assert not (spare.owner or spare.cost or spare.last_ran or spare.moved)


def test_a_job_whose_analyses_never_finish_ages_out_like_an_idle_one() -> None:
    shares = WorkerShares(2)
    failing = ("failing", 1)
    shares.slot(failing)  # placed, never ran
    assert sum(shares.loads()) > 0
    for _ in range(RECENT_PASSES + 1):
        shares.adapt(INTERVAL)
    assert shares.loads() == [0.0, 0.0]


def test_costs_that_vary_a_little_from_pass_to_pass_move_nothing() -> None:
    shares = WorkerShares(2)
    costs = dict.fromkeys(jobs(400), 0.025)  # 5 s a worker: past SHRINK_AT, so evening out matters
    rng = random.Random(7)
    run_pass(shares, costs)
    shares.adapt(INTERVAL)
    for _ in range(10):
        run_pass(shares, {j: c * rng.uniform(0.8, 1.25) for j, c in costs.items()})
        assert not shares.adapt(INTERVAL).moved


def test_a_replica_that_keeps_up_moves_nothing() -> None:
    shares = WorkerShares(2, spare=1)
    costs = {**dict.fromkeys(jobs(30), 0.1), ("big", 1): 1.0}
    for _ in range(5):
        run_pass(shares, costs)
        change = shares.adapt(INTERVAL)
        assert not change.moved and not change.grown
    assert shares.active == 2


def test_no_spare_while_ingest_needs_its_core_and_a_taken_one_goes_at_once() -> None:
    shares = WorkerShares(1, spare=1)
    costs = dict.fromkeys(jobs(500), 0.024)
    run_pass(shares, costs)
    assert not shares.adapt(INTERVAL, spare_ok=False).grown and shares.active == 1
    run_pass(shares, costs)
    change = shares.adapt(INTERVAL)
    assert change.grown and shares.active == 2
    on_spare = set(change.moved[0])
    run_pass(shares, costs)
    change = shares.adapt(INTERVAL, spare_ok=False)  # a busy pass, but ingest wants the core
    assert change.retired == 1 and shares.active == 1
    assert set(change.moved[1]) == on_spare
    run_pass(shares, costs)
    assert set(shares.owner.values()) == {0}
