"""Job analyses run in worker processes: the same result as in the server process, several jobs
at once, and a worker that dies costs one pass of one job, not the server."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from smon_server.context import ServerContext
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs import processes, window_cache, worker_shares
from smon_server.jobs import workers as workers_module
from smon_server.jobs.loop import analysis_pass
from smon_server.store import migrate
from smon_server.store.db import Database
from smon_server.store.models import AnalysisResult, Job
from smon_server.store.queries import StepWindow
from tests.support import factories as f
from tests.support.server_process import free_port, start_server
from tests.support.settings import server_settings
from tests.support.stored import store_batches

RANKS = 4
NOW = f.T0 + 60  # a minute after the steps: the job is still running


def push(
    db: Database, job: str, steps: range, *, seq: int = 1, origin: float = f.T0, now: float = NOW
) -> None:
    """A DP job with rank 2 20 ms slow in forward, written through the store's own writer."""
    records = f.dp_job_steps(RANKS, steps, slow_rank=2, slow_forward=0.020, origin=origin)
    batches = [f.batch(job, r, RANKS, seq=seq, steps=records[r]) for r in range(RANKS)]
    store_batches(db, batches, now=now)


@pytest.fixture
def context(database_url: str) -> Iterator[ServerContext]:
    ctx = ServerContext.from_settings(server_settings(database_url, analysis_workers=2))
    migrate.upgrade(ctx.db)
    try:
        yield ctx
    finally:
        ctx.close()


def stored(ctx: ServerContext, job: str) -> dict[str, Any]:
    """The stored analysis's summary, read while its (deferred) columns can still load."""
    with ctx.db.session() as session:
        row = session.get(AnalysisResult, (job, 1))
        assert row is not None and row.summary is not None
        return dict(row.summary)


def test_a_worker_process_stores_what_the_server_process_would(context: ServerContext) -> None:
    for job in ("one", "two", "three"):
        push(context.db, job, range(60))
    assert analysis_pass(context, NOW) == 3
    assert context.workers is not None
    assert context.workers.pids and os.getpid() not in context.workers.pids
    for job in ("one", "two", "three"):
        row = stored(context, job)
        with context.db.session() as session:
            here = job_analysis.analyze_job(
                session=session,
                job=session.scalars(select(Job).where(Job.job_id == job)).one(),
                settings=context.settings,
                now=NOW,
            )
        assert row == here["summary"]
        assert [s["rank"] for s in row["stragglers"]] == [2]
        assert row["slowdown"] > 1.2


def test_an_asked_for_window_is_analysed_in_a_worker_process_as_in_the_server_process(
    context: ServerContext,
) -> None:
    """jobs/windows.py hands a window the pass has not stored to a process of its own."""
    push(context.db, "zoom", range(60))
    window = StepWindow(from_step=20, to_step=45)
    with context.db.session() as session:
        job = session.scalars(select(Job).where(Job.job_id == "zoom")).one()
        there = context.windows.analyse(session, job, window)
        assert context.windows.analyse(session, job, window) is not None  # kept: served from memory
        here = job_analysis.analyze_job(
            session=session, job=job, settings=context.settings, now=time.time(), window=window
        )
    assert context.workers is not None and context.workers._windows is not None  # ran over there
    assert there["summary"] == here["summary"] and there["steps"] == here["steps"]
    assert (there["summary"]["from_step"], there["summary"]["to_step"]) == (20, 45)


def test_a_dead_worker_fails_one_pass_and_the_next_pass_recovers(context: ServerContext) -> None:
    push(context.db, "dies", range(40))
    assert analysis_pass(context, NOW) == 1
    assert context.workers is not None
    killed = set(context.workers.pids)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)  # what the kernel's OOM killer does to a worker
    later = NOW + 5
    push(context.db, "dies", range(40, 80), seq=2, origin=f.T0 + 3, now=later)
    analysis_pass(context, later)  # this pass may fail on the dead pool: logged, not raised
    analysis_pass(context, later + 1)
    row = stored(context, "dies")
    assert row["to_step"] == 79
    assert context.workers.pids - killed  # analysed by a new worker
    assert [s["rank"] for s in row["stragglers"]] == [2]


def _children(pid: int) -> set[int]:
    """Child processes of `pid`, whichever of its threads started them."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
    return found


def test_workers_leave_when_their_server_is_killed(database_url: str) -> None:
    """SIGKILL (the OOM killer, a node drain) runs no shutdown code: the workers notice their
    server is gone and exit instead of living on with its memory and connections."""
    if not Path("/proc/self/task").exists():
        pytest.skip("needs Linux /proc to find the server's worker processes")
    db = Database(database_url)
    migrate.upgrade(db)
    push(db, f.new_job_id("orphan"), range(40), now=time.time())
    db.dispose()
    env = {"SMON_ANALYSIS_WORKERS": "1", "SMON_ANALYSIS_INTERVAL": "0.5"}
    server = start_server(database_url, free_port(), free_port(), env)
    try:
        deadline = time.monotonic() + 60
        while not (workers := _children(server.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the pool starts with the first pass that has a job to analyse
        assert workers, "the server started no analysis worker"
    finally:
        server.kill()
        server.wait(10)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "analysis workers outlived their killed server"


def test_big_jobs_have_a_worker_of_their_own(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one worker for the small jobs, a big job goes to one more worker, so its long passes
    do not hold up theirs; each job keeps its worker from pass to pass."""
    monkeypatch.setattr(workers_module, "BIG_JOB_RANKS", 4)
    ctx = ServerContext.from_settings(server_settings(database_url, analysis_workers=1))
    migrate.upgrade(ctx.db)
    try:
        small = [f.new_job_id("small") for _ in range(2)]
        big = f.new_job_id("big")
        for job in small:
            records = f.dp_job_steps(2, range(40), slow_rank=1, slow_forward=0.020, origin=f.T0)
            batches = [f.batch(job, r, 2, steps=records[r]) for r in range(2)]
            store_batches(ctx.db, batches, now=NOW)
        push(ctx.db, big, range(40))
        assert analysis_pass(ctx, NOW) == 3
        workers = ctx.workers
        assert workers is not None and len(workers.pids) == 2
        # The small jobs share the one small-job worker; the big one is not among them.
        assert workers.shares.owner == {(job, 1): 0 for job in small}
        assert [s["rank"] for s in stored(ctx, big)["stragglers"]] == [2]
        push(ctx.db, big, range(40, 50), seq=2, origin=f.T0 + 3, now=NOW + 5)
        assert analysis_pass(ctx, NOW + 5) == 1
        assert len(workers.pids) == 2 and stored(ctx, big)["to_step"] == 49
    finally:
        ctx.close()


def test_the_spare_worker_is_taken_while_passes_near_the_interval_and_given_back_once_they_keep_up(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SMON_ANALYSIS_WORKERS unset on two cores: one worker, and the second core's worker only
    while passes near the interval. Jobs moved to it are analysed there as they were before;
    given back, its process ends and its jobs return."""
    monkeypatch.setattr(processes.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(worker_shares, "MOVE_BUDGET", 1e9)  # move all it takes in one pass
    ctx = ServerContext.from_settings(server_settings(database_url, analysis_workers=None))
    migrate.upgrade(ctx.db)
    jobs = [f.new_job_id("spare") for _ in range(4)]
    try:
        workers = ctx.workers
        assert workers is not None and workers.active == 1 and workers.slots == 2
        for job in jobs:
            push(ctx.db, job, range(40))
        # A pass far longer than this interval, but ingest at capacity: no spare.
        ctx.settings = ctx.settings.model_copy(update={"analysis_interval": 0.001})
        ctx.ingest_load = lambda: 1.0
        assert analysis_pass(ctx, NOW) == 4
        assert not workers.last_change.grown and workers.active == 1
        # Ingest light: the spare is taken, jobs move to it.
        ctx.ingest_load = lambda: 0.1
        for job in jobs:
            push(ctx.db, job, range(40, 45), seq=2, origin=f.T0 + 3, now=NOW + 2)
        assert analysis_pass(ctx, NOW + 2) == 4
        assert workers.last_change.grown and workers.active == 2
        assert ctx.registry.get_sample_value("smon_analysis_workers") == 2
        moved = set(workers.last_change.moved[0])
        assert 0 < len(moved) < len(jobs) and len(workers.pids) == 1
        for job in jobs:
            push(ctx.db, job, range(45, 50), seq=3, origin=f.T0 + 4, now=NOW + 5)
        ctx.settings = ctx.settings.model_copy(update={"analysis_interval": 1000.0})
        ctx.ingest_load = lambda: 0.6  # above what takes the spare, below what gives it back
        assert analysis_pass(ctx, NOW + 5) == 4
        assert workers.active == 2
        assert len(workers.pids) == 2  # the moved jobs ran on the spare
        spare = workers._pools[1]
        assert spare is not None
        (pid,) = [p.pid for p in spare._processes.values() if p.pid is not None]
        for job in jobs:
            row = stored(ctx, job)
            assert row["to_step"] == 49 and [s["rank"] for s in row["stragglers"]] == [2]
        # Passes that fit one worker fewer, QUIET_PASSES in a row (the one above the first): the
        # spare goes.
        for i in range(worker_shares.QUIET_PASSES - 2):
            analysis_pass(ctx, NOW + 6 + i)
        assert workers.active == 2
        analysis_pass(ctx, NOW + 10)
        assert workers.active == 1 and workers.last_change.retired == 1
        assert set(workers.last_change.moved[1]) == moved
        assert ctx.registry.get_sample_value("smon_analysis_workers") == 1
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid)
        for job in jobs:
            push(ctx.db, job, range(50, 60), seq=4, origin=f.T0 + 6, now=NOW + 20)
        assert analysis_pass(ctx, NOW + 20) == 4
        assert set(workers.shares.owner.values()) == {0}
        for job in jobs:
            row = stored(ctx, job)
            assert row["to_step"] == 59 and [s["rank"] for s in row["stragglers"]] == [2]
    finally:
        ctx.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for this purpose: its memory is freed.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_window_cache_is_split_by_the_load_each_worker_holds(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the spare is taken, the small jobs' default third of memory is split over the
    workers by the load of their jobs (a floor of a quarter of an even split): together they keep
    what one worker kept. SMON_ANALYSIS_CACHE_MB is per process and left alone."""
    monkeypatch.setattr(processes.os, "cpu_count", lambda: 2)
    settings = server_settings(database_url, analysis_workers=None)
    workers = workers_module.AnalysisWorkers(settings, 1, 1)  # no process started: none is asked for
    third = window_cache.cache_bytes(settings)
    assert workers._cache_share(0) == third
    shares = workers.shares
    for i in range(100):
        shares.ran((f"a{i}", 1), shares.slot((f"a{i}", 1)), 0.1)
    shares.active = 2
    for i in range(10):
        shares.owner[(f"a{i}", 1)] = 1  # a tenth moved to the spare
    workers._split = None
    assert workers._cache_share(0) == pytest.approx(0.9 * third, rel=1e-6)
    assert workers._cache_share(1) == pytest.approx(0.125 * third, rel=1e-6)  # the floor: 1/8
    per_process = workers_module.AnalysisWorkers(settings.model_copy(update={"analysis_cache_mb": 300}), 1, 1)
    assert per_process._cache_share(0) is None
