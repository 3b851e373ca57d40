"""A job's trend outlives its analysis window and its raw steps: `GET /jobs/{id}/trend`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import delete

from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.store.models import StepRecord
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.stored import store_batches

RANKS = 4
CHUNK = 40  # steps per push and per analysis window: each pass sees only the newest 40 steps
SLOW = range(60, 120)  # rank 2 is 20 ms slow in forward on these steps only


@pytest.fixture
def server(database_url: str) -> Iterator[BackgroundServer]:
    settings = server_settings(
        database_url, analysis_interval=3600, analysis_window_steps=CHUNK, stall_seconds=10_000
    )
    with BackgroundServer(settings) as running:
        yield running


def run_job(server: BackgroundServer, job: str, total: int) -> float:
    """Push `total` steps in chunks, one analysis pass after each; returns the last pass's time."""
    assert server.context is not None
    origin, now = f.T0, f.T0 + 10
    for seq, first in enumerate(range(0, total, CHUNK), start=1):
        records: dict[int, list] = {r: [] for r in range(RANKS)}
        for step in range(first, first + CHUNK):
            one = f.dp_job_steps(
                RANKS, [step], slow_rank=2 if step in SLOW else None, slow_forward=0.020, origin=origin
            )
            for r in range(RANKS):
                records[r].extend(one[r])
            origin = max(rec.end_time for r in range(RANKS) for rec in one[r])
        batches = [f.batch(job, r, RANKS, seq=seq, steps=records[r]) for r in range(RANKS)]
        now = origin + 1
        store_batches(server.context.db, batches, now=now)
        analysis_pass(server.context, now)
    return now


def trend(server: BackgroundServer, job: str, **params: int) -> dict:
    response = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/trend", params=params, timeout=30)
    response.raise_for_status()
    return dict(response.json())


def test_the_trend_keeps_every_window_a_job_went_through(server: BackgroundServer) -> None:
    job = f.new_job_id("trend")
    run_job(server, job, 200)
    body = trend(server, job)
    points = body["points"]
    assert body["bucket_steps"] == 50
    # Warm-up (steps 0-9) is left out; everything after is there although each pass saw 40 steps.
    assert (points[0]["from_step"], points[-1]["to_step"]) == (10, 199)
    assert sum(p["steps"] for p in points) == 190
    by_bucket = {p["from_step"] // 50: p for p in points}
    slow = [by_bucket[1], by_bucket[2]]  # steps 50-99 and 100-149 hold the slow stretch
    fine = [by_bucket[0], by_bucket[3]]
    assert all(p["stragglers"] == [2] and p["slowdown"] > 1.15 for p in slow), slow
    assert all(p["stragglers"] == [] and p["slowdown"] < 1.1 for p in fine), fine
    # The window a pass sees now (160-199) is clean: without the trend the slow stretch is gone.
    summary = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/summary", timeout=30).json()
    assert summary["stragglers"] == []


def test_points_merge_and_ranges_cut(server: BackgroundServer) -> None:
    job = f.new_job_id("trend")
    run_job(server, job, 200)
    one = trend(server, job, max_points=1)["points"]
    assert len(one) == 1 and one[0]["steps"] == 190 and one[0]["stragglers"] == [2]
    cut = trend(server, job, from_step=60, to_step=119)["points"]
    assert (cut[0]["from_step"], cut[-1]["to_step"], sum(p["steps"] for p in cut)) == (60, 119, 60)
    assert all(p["slowdown"] > 1.15 for p in cut)


def test_the_trend_outlives_the_raw_steps(server: BackgroundServer) -> None:
    job = f.new_job_id("trend")
    now = run_job(server, job, 120)
    before = trend(server, job)
    assert server.context is not None
    with server.context.db.transaction() as session:  # what retention does to old records
        session.execute(delete(StepRecord))
    analysis_pass(server.context, now + 20_000)  # the job is finished by now
    assert trend(server, job) == before
    assert httpx.get(f"{server.http_url}/api/v1/jobs/nope/trend").status_code == 404
