"""A job whose analysis fails is marked so, once: the pass goes on with every other job, the job's
summary says the analysis failed and why (no route answers 500), the failure is logged once per
job and reason, and the job is tried again when new steps arrive, not on every pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from smon_server.context import ServerContext
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs import live
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.store.models import AnalysisResult
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.stored import store_batches

WORLD = 2


@pytest.fixture
def server(database_url: str) -> Iterator[BackgroundServer]:
    # Passes run by the test alone (the loop's first, at start, finds no job).
    settings = server_settings(database_url, warmup_steps=0, analysis_interval=3600)
    with BackgroundServer(settings) as running:
        yield running


def _push(context: ServerContext, job: str, steps: range, seq: int, origin: float) -> None:
    records = f.dp_job_steps(WORLD, steps, slow_rank=1, slow_forward=0.02, origin=origin)
    batches = [f.batch(job, r, WORLD, seq=seq, steps=records[r]) for r in range(WORLD)]
    store_batches(context.db, batches, now=time.time())


def _result(context: ServerContext, job: str) -> AnalysisResult:
    with context.db.session() as session:
        row = session.get(AnalysisResult, (job, 1))
        assert row is not None
        return row


def test_a_failing_job_is_marked_once_and_the_others_go_on(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    context = server.context
    assert context is not None
    origin = time.time() - 120
    _push(context, "good", range(20), 1, origin)
    _push(context, "bad", range(20), 1, origin)
    real = live.analyze_live
    calls: list[str] = []

    def breaks_on_bad(ops: Any, **kwargs: Any) -> live.LiveAnalysis:
        calls.append(kwargs["job_id"])
        if kwargs["job_id"] == "bad":  # numbers that change from pass to pass: the same reason
            raise ValueError(f"'list' argument must have no negative elements ({len(calls)})")
        return real(ops, **kwargs)

    monkeypatch.setattr(job_analysis.live, "analyze_live", breaks_on_bad)
    caplog.set_level(logging.INFO, logger="smon_server")
    assert analysis_pass(context, time.time()) == 2  # both stored: one analysis, one failure
    good, bad = _result(context, "good"), _result(context, "bad")
    assert good.slowdown is not None and good.slowdown > 1.1 and not good.error
    assert bad.error.startswith("ValueError: 'list' argument") and bad.error_at is not None
    assert bad.slowdown is None and bad.state == "running"
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failed) == 1 and "bad" in failed[0].getMessage() and failed[0].exc_info is not None

    # No news: the failed job is not tried again on every pass.
    calls.clear()
    analysis_pass(context, time.time())
    assert calls == []
    # New steps: tried again, failing the same way: not logged again.
    first_at = bad.error_at
    _push(context, "bad", range(20, 30), 2, origin + 60)
    analysis_pass(context, time.time())
    again = _result(context, "bad").error_at
    assert calls == ["bad"] and first_at is not None and again is not None and again > first_at
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1

    # Every route answers, and the summary says why there are no numbers.
    client = httpx.Client(base_url=server.http_url, timeout=30)
    summary = client.get("/api/v1/jobs/bad/summary")
    assert summary.status_code == 200, summary.text
    body = summary.json()
    assert body["analysis_state"] == "failed" and body["analysis_error"] == _result(context, "bad").error
    assert body["analysis_failed_at"] is not None and body["slowdown"] is None
    for route in ("steps", "workers", "heatmap", "heatmap?metric=forward", "workers/1", "summary?window=5"):
        r = client.get(f"/api/v1/jobs/bad/{route}")
        assert r.status_code == 200, (route, r.text)
    assert client.get("/api/v1/jobs/bad/summary?window=5").json()["analysis_state"] == "failed"
    listed = {j["job_id"]: j for j in client.get("/api/v1/jobs").json()["jobs"]}
    assert listed["bad"]["analysis_error"] and listed["good"]["analysis_error"] is None
    assert client.get("/api/v1/jobs/good/summary").json()["analysis_state"] == "ok"

    # Fixed (a new server version, say) and new steps: the numbers are back, the mark gone.
    monkeypatch.setattr(job_analysis.live, "analyze_live", real)
    _push(context, "bad", range(30, 40), 3, origin + 90)
    analysis_pass(context, time.time())
    healed = _result(context, "bad")
    assert not healed.error and healed.error_at is None and healed.slowdown is not None
    assert any("works again" in r.getMessage() for r in caplog.records)
    assert client.get("/api/v1/jobs/bad/summary").json()["analysis_state"] == "ok"
    client.close()


def test_a_worker_that_died_is_tried_again_once() -> None:
    """Killed once, a job's analysis is retried at the next pass (another process's memory may
    have been to blame); killed again on it, it waits for new steps like any failure."""
    from concurrent.futures.process import BrokenProcessPool

    from smon_server.jobs import failures
    from smon_server.jobs.processes import WORKER_DIED, WORKER_DIED_AGAIN

    assert failures.describe(BrokenProcessPool("gone")) == WORKER_DIED
    assert failures.describe(BrokenProcessPool("gone"), WORKER_DIED) == WORKER_DIED_AGAIN
    assert failures.describe(BrokenProcessPool("gone"), WORKER_DIED_AGAIN) == WORKER_DIED_AGAIN
    assert failures.describe(MemoryError()) == "MemoryError"
    assert failures.describe(ValueError("a\nb" + "x" * 600)) == "ValueError: a"
