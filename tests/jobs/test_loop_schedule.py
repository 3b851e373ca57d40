"""The analysis loop's schedule: passes an interval apart from start to start, and within a pass
the smaller jobs first, so a big job's seconds-long analysis does not hold up the small ones."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from smon_server.context import ServerContext
from smon_server.jobs import loop
from smon_server.jobs.loop import analysis_pass, pause_after
from smon_server.runtime import BackgroundServer
from smon_server.store import grids, migrate
from smon_server.store.models import AnalysisResult
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.stored import store_batches


def test_passes_start_an_interval_apart() -> None:
    assert pause_after(10.0, 0.5) == pytest.approx(9.5)
    assert pause_after(10.0, 6.0) == pytest.approx(4.0)
    assert pause_after(10.0, 14.0) == 0.0  # a pass longer than the interval: the next at once


def test_a_background_server_is_started_once_its_first_pass_has_ended(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that stores steps and runs passes itself must not race the loop's first pass for a
    job's lease (on a loaded machine that pass can start after the test's steps are stored)."""
    real = loop.analysis_pass

    def late(context: loop.LoopContext, now: float) -> int:
        time.sleep(1.0)
        return real(context, now)

    monkeypatch.setattr(loop, "analysis_pass", late)
    settings = server_settings(database_url, analysis_interval=3600)
    with BackgroundServer(settings) as server:
        assert server.context is not None and server.context.first_pass_done.is_set()
    # A first pass past its bound: an error, and the server stopped rather than left running.
    slow = BackgroundServer(settings)
    with pytest.raises(TimeoutError, match="first analysis pass"):
        slow.start(first_pass_timeout=0.2)
    assert not slow._thread.is_alive()


@pytest.fixture
def context(database_url: str) -> Iterator[ServerContext]:
    ctx = ServerContext.from_settings(server_settings(database_url, analysis_workers=0))
    migrate.upgrade(ctx.db)
    try:
        yield ctx
    finally:
        ctx.close()


def test_a_pass_analyses_the_smaller_jobs_first(
    context: ServerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = {"big": 16, "small": 2, "middle": 8, "tiny": 1}
    names = {}
    for name, ranks in sizes.items():
        job = names[name] = f.new_job_id(name)
        records = f.dp_job_steps(ranks, range(3), origin=f.T0)
        batches = [f.batch(job, r, ranks, steps=records[r]) for r in range(ranks)]
        store_batches(context.db, batches, now=f.T0 + 1)
    order: list[str] = []

    def record(ctx: ServerContext, job_id: str, now: float, *, attempt: int | None = None) -> bool:
        order.append(job_id)
        return True

    monkeypatch.setattr(loop, "analyse_one", record)
    assert analysis_pass(context, f.T0 + 2) == 4
    assert order == [names[n] for n in ("tiny", "small", "middle", "big")]


def test_a_pass_leases_only_the_jobs_with_news(
    context: ServerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs with no new steps and an unchanged state are found at once and never leased; new steps
    or a state change (here: the job went quiet, finished) bring a job back into the pass."""
    jobs = [f.new_job_id("quiet"), f.new_job_id("busy")]
    records = f.dp_job_steps(2, range(6), origin=f.T0)

    def store(job: str, steps: range, now: float, seq: int) -> None:
        batches = [f.batch(job, r, 2, seq=seq, steps=[records[r][s] for s in steps]) for r in range(2)]
        store_batches(context.db, batches, now=now)

    for job in jobs:
        store(job, range(3), f.T0 + 1, 1)
    assert analysis_pass(context, f.T0 + 2) == 2
    leased: list[str] = []
    analyse = loop.analyse_one

    def spy(ctx: ServerContext, job_id: str, now: float, *, attempt: int | None = None) -> bool:
        leased.append(job_id)
        return analyse(ctx, job_id, now, attempt=attempt)

    monkeypatch.setattr(loop, "analyse_one", spy)
    assert analysis_pass(context, f.T0 + 3) == 0
    assert leased == []
    store(jobs[1], range(3, 6), f.T0 + 4, 2)
    assert analysis_pass(context, f.T0 + 5) == 1
    assert leased == [jobs[1]]
    leased.clear()
    stall = context.settings.stall_seconds
    assert analysis_pass(context, f.T0 + 10 + 2 * stall) == 2  # nothing heard since: finished
    assert sorted(leased) == sorted(jobs)
    leased.clear()
    assert analysis_pass(context, f.T0 + 11 + 2 * stall) == 0
    assert leased == []


def test_the_lag_says_how_stale_the_jobs_with_news_are(context: ServerContext) -> None:
    """`smon_analysis_lag_seconds`: at a pass, the age of the stalest stored analysis among the jobs
    with news (since first seen when never analysed); 0 when nothing waits."""
    stats = context.analysis_stats
    job = f.new_job_id("lag")
    records = f.dp_job_steps(2, range(6), origin=f.T0)
    store_batches(context.db, [f.batch(job, r, 2, steps=records[r][:3]) for r in range(2)], now=f.T0 + 1)
    assert analysis_pass(context, f.T0 + 40) == 1
    # never analysed before: since the job was first seen (its first batch, at T0 + 1)
    assert stats.lag_seconds._value.get() == pytest.approx(39.0, abs=1.0)
    assert stats.interval_seconds._value.get() == context.settings.analysis_interval
    assert analysis_pass(context, f.T0 + 50) == 0  # no news: nothing waits
    assert stats.lag_seconds._value.get() == 0.0
    store_batches(
        context.db, [f.batch(job, r, 2, steps=records[r][3:], seq=2) for r in range(2)], now=f.T0 + 60
    )
    assert analysis_pass(context, f.T0 + 100) == 1
    assert stats.lag_seconds._value.get() == pytest.approx(60.0)  # computed at T0 + 40


def test_a_write_stamped_before_a_pass_but_read_after_it_is_news(context: ServerContext) -> None:
    """An ingest transaction stamps its time before it commits; a pass that began in between read
    the records without it. Its records (here the last rank's, of steps the others sent) must
    bring the job back into the next pass, though its stamp is older than the pass."""
    job = f.new_job_id("late-rank")
    records = f.dp_job_steps(4, range(20), origin=f.T0)
    store_batches(context.db, [f.batch(job, r, 4, steps=records[r]) for r in range(3)], now=f.T0 + 1)
    assert analysis_pass(context, f.T0 + 10) == 1
    store_batches(context.db, [f.batch(job, 3, 4, steps=records[3])], now=f.T0 + 5)  # stamped before
    assert analysis_pass(context, f.T0 + 11) == 1
    with context.db.session() as session:
        stored = session.get(AnalysisResult, (job, 1))
        assert stored is not None and grids.unpack(stored.heatmap).ranks.tolist() == [0, 1, 2, 3]
    assert analysis_pass(context, f.T0 + 12) == 0  # read: no news any more
