"""A job's default window is bounded in rank-steps as well as in steps (jobs/step_ranges.py
`window_steps`): the largest jobs' passes analyse fewer steps, so a pass's cost follows the
operations it replays, not the job's size; small jobs keep the whole SMON_ANALYSIS_WINDOW_STEPS."""

from __future__ import annotations

from typing import Any

from smon_server.jobs import analysis
from smon_server.jobs.step_ranges import window_steps
from smon_server.settings import Settings
from smon_server.store.db import Database
from smon_server.store.models import Job
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.stored import store_batches


def test_the_window_shrinks_with_the_ranks_past_the_rank_step_budget() -> None:
    settings = Settings(database_url="sqlite://")
    assert [window_steps(settings, n) for n in (None, 1, 64, 4096, 8192, 16384, 65536)] == [
        500, 500, 500, 500, 256, 128, 50,
    ]  # fmt: skip
    tight = settings.model_copy(update={"analysis_window_rank_steps": 1000, "analysis_window_min_steps": 20})
    assert [window_steps(tight, n) for n in (2, 8, 64)] == [500, 125, 20]


def _pass(db: Database, ranks: int, steps: int, settings: Settings) -> dict[str, Any]:
    job_id = f.new_job_id(f"bounded-{ranks}")
    records = f.dp_job_steps(ranks, range(steps), slow_rank=1, slow_forward=0.02)
    store_batches(db, [f.batch(job_id, r, ranks, steps=records[r]) for r in range(ranks)], now=f.T0 + 100)
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        return analysis.analyze_job(session=session, job=job, settings=settings, now=f.T0 + 100)


def test_a_pass_over_a_large_job_analyses_the_newest_steps_its_budget_allows(database_url: str) -> None:
    """Same budget, two jobs of 60 steps: 2 ranks keep all of them, 8 ranks the newest 25 (200 of
    its rank-steps), and the analysis still names the slow rank."""
    db = Database(database_url)
    try:
        settings: Settings = server_settings(
            database_url, analysis_window_rank_steps=200, analysis_window_min_steps=10, warmup_steps=0
        )
        small, large = _pass(db, 2, 60, settings)["summary"], _pass(db, 8, 60, settings)["summary"]
        assert (small["from_step"], small["to_step"]) == (0, 59)
        assert (large["from_step"], large["to_step"]) == (60 - 25, 59) and large["steps_seen"] == 25
        assert [s["rank"] for s in large["stragglers"]] == [1]
    finally:
        db.dispose()


def test_the_recent_stretch_is_at_most_a_tenth_of_the_window() -> None:
    from smon_server.jobs.step_ranges import recent_steps_most

    settings = Settings(database_url="sqlite://")
    assert [recent_steps_most(settings, n) for n in (64, 8192, 16384, 65536)] == [50, 25, 12, 5]
