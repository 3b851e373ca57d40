"""Reads only read: stored analyses are served as stored, other windows are analysed by
jobs/windows.py (bounded, cached, timed), and a job that left its stored state wakes the loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest

from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.jobs import analysis as job_analysis
from smon_server.runtime import BackgroundServer
from smon_server.store.models import AnalysisResult
from tests.api.test_jobs import STEPS, WORLD, analyse, push_job
from tests.support import factories as f
from tests.support.settings import server_settings

TIMEOUT = 0.5  # SMON_WINDOW_ANALYSIS_TIMEOUT here


@pytest.fixture
def quiet_server(sqlite_url: str) -> Iterator[BackgroundServer]:
    """A server whose loop passes only when woken (or when a test runs one)."""
    settings = server_settings(sqlite_url, analysis_interval=3600, window_analysis_timeout=TIMEOUT)
    with BackgroundServer(settings) as running:
        yield running


def _until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_job_that_left_its_stored_state_is_served_as_stored_and_the_loop_refreshes_it(
    quiet_server: BackgroundServer,
) -> None:
    server = quiet_server
    assert server.context is not None
    job = f.new_job_id("left")
    push_job(server, job)
    analyse(server)
    with server.context.db.transaction() as session:  # as if it had stalled at the last pass
        row = session.get(AnalysisResult, (job, 1))
        assert row is not None and row.state == "running"
        row.state = "stalled"
    url = f"{server.http_url}/api/v1/jobs/{job}/summary"
    # Served as stored, with the state its numbers were computed in: the request analysed nothing.
    assert httpx.get(url).json()["state"] == "stalled"
    # ... and it woke the loop (its interval is an hour), whose pass stored the job's state now.
    assert _until(lambda: httpx.get(url).json()["state"] == "running")


def test_a_job_not_analysed_yet_is_analysed_for_the_request_and_by_the_woken_loop(sqlite_url: str) -> None:
    # Not the quiet server: the request's analysis shares the process with the pass it wakes, and
    # on a loaded machine took over the half second the other tests here time out at.
    settings = server_settings(sqlite_url, analysis_interval=3600, window_analysis_timeout=60)
    with BackgroundServer(settings) as server:
        job = f.new_job_id("new")
        push_job(server, job)
        answer = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/summary", timeout=90)
        assert answer.status_code == 200, answer.text
        summary = answer.json()
        assert summary["state"] == "running" and summary["steps_seen"] > 0

        def stored() -> bool:
            listed = httpx.get(f"{server.http_url}/api/v1/jobs", params={"job_id": job}).json()["jobs"]
            return listed[0]["computed_at"] is not None

        assert _until(stored, 60)  # the woken loop's pass stored it (its interval is an hour)


def test_windows_are_bounded_timed_and_cached(
    quiet_server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = quiet_server
    job = f.new_job_id("zoom")
    push_job(server, job)
    analyse(server)
    gate = threading.Event()
    calls: list[Any] = []
    analyze_job = job_analysis.analyze_job

    def held(**kwargs: Any) -> Any:
        calls.append(kwargs["window"])
        gate.wait(30)
        return analyze_job(**kwargs)

    monkeypatch.setattr(job_analysis, "analyze_job", held)
    url = f"{server.http_url}/api/v1/jobs/{job}/steps"
    first, second, third = ({"from_step": lo, "to_step": STEPS - 1} for lo in (12, 13, 14))

    timed_out = httpx.get(url, params=first)
    assert timed_out.status_code == 504
    assert "SMON_WINDOW_ANALYSIS_TIMEOUT" in timed_out.json()["detail"]
    assert httpx.get(url, params=second).status_code == 504
    busy = httpx.get(url, params=third)  # two are running: the most at once
    assert busy.status_code == 503 and busy.headers["retry-after"]
    assert "retry" in busy.json()["detail"]
    assert httpx.get(url, params=first).status_code == 504  # waits for the running one again
    assert len(calls) == 2

    gate.set()  # the analyses finish and are kept
    assert _until(lambda: httpx.get(url, params=first).status_code == 200)
    steps = httpx.get(url, params=first).json()["steps"]
    assert [s["step"] for s in steps] == list(range(12, STEPS))
    assert httpx.get(url, params=second).status_code == 200
    assert len(calls) == 2  # both from memory

    # New steps: the job's last step moved, so the kept analysis is not served again.
    more = f.dp_job_steps(WORLD, range(STEPS, STEPS + 5), origin=time.time() - 10)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        for rank, records in more.items():
            stub.Push(f.batch(job, rank, WORLD, seq=3, steps=records, host=f"node-{rank}"))
    # Analysed again (on a loaded machine past the half-second timeout: a retry waits for the
    # same analysis rather than starting another).
    assert _until(lambda: httpx.get(url, params=first).status_code == 200)
    assert len(calls) == 3
