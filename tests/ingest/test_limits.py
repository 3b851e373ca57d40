"""Per-agent rate limits: a flooding agent is slowed, then refused; the others are not touched."""

from __future__ import annotations

import grpc
import pytest

from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.ingest.limits import ActiveJobs, AgentRates
from smon_server.runtime import BackgroundServer
from tests.support import factories as f
from tests.support.settings import server_settings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_lets_bursts_through_then_throttles_then_refuses() -> None:
    clock = Clock()
    rates = AgentRates(100, burst_seconds=1.0, clock=clock)
    assert rates.take("a", 100) == 0.0  # the burst
    assert rates.take("a", 50) == pytest.approx(0.5)  # borrowed: hold back until it is paid
    assert rates.take("a", 60) is None  # deeper than one more burst: refused
    assert rates.take("b", 100) == 0.0  # another agent has its own bucket
    clock.now = 0.5  # 50 records refilled: the debt is paid
    assert rates.take("a", 10) == pytest.approx(0.1)
    clock.now = 100.0
    assert rates.take("a", 100) == 0.0  # refilled, capped at the burst


def test_a_flooding_agent_is_throttled_then_refused_and_others_go_through(database_url: str) -> None:
    settings = server_settings(database_url, ingest_agent_records_per_second=2.0)  # burst: 20 records
    steps = f.dp_job_steps(1, range(60))[0]
    with BackgroundServer(settings) as server, grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        job = f.new_job_id()
        first = stub.Push(f.batch(job, 0, 2, seq=1, steps=steps[:20]))
        assert (first.accepted, first.throttle_seconds) == (20, 0.0)
        second = stub.Push(f.batch(job, 0, 2, seq=2, steps=steps[20:35]))
        assert second.accepted == 15 and second.throttle_seconds > 5  # stored, and told to wait
        third = stub.Push(f.batch(job, 0, 2, seq=3, steps=steps[35:60]))
        assert (third.accepted, third.rejected) == (0, 25)
        assert [r.reason for r in third.rejections] == ["rate_limited"]
        other = stub.Push(f.batch(job, 1, 2, seq=1, steps=steps[:20]))
        assert (other.accepted, other.throttle_seconds) == (20, 0.0)


def test_active_jobs_admits_known_jobs_and_refuses_new_ones_past_the_limit() -> None:
    clock = Clock()
    jobs = ActiveJobs(2, window_seconds=60, clock=clock)
    assert jobs.admit("a") and jobs.admit("b")
    assert not jobs.admit("c")  # two others are reporting
    clock.now = 50
    assert jobs.admit("a")  # a known job always goes through (and stays active)
    clock.now = 100  # b has been quiet for the window: its place is free
    assert jobs.admit("c")
    assert not jobs.admit("d")


def test_a_new_job_past_the_limit_is_refused_and_counted(database_url: str) -> None:
    settings = server_settings(database_url, ingest_max_jobs=2)
    steps = f.dp_job_steps(1, range(3))[0]
    with BackgroundServer(settings) as server, grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        first, second, third = f.new_job_id(), f.new_job_id(), f.new_job_id()
        assert stub.Push(f.batch(first, 0, 1, seq=1, steps=steps[:1])).accepted == 1
        assert stub.Push(f.batch(second, 0, 1, seq=1, steps=steps[:1])).accepted == 1
        refused = stub.Push(f.batch(third, 0, 1, seq=1, steps=steps[:1]))
        assert (refused.accepted, refused.rejected) == (0, 1)
        assert [r.reason for r in refused.rejections] == ["too_many_jobs"]
        assert "SMON_INGEST_MAX_JOBS" in refused.rejections[0].detail
        assert stub.Push(f.batch(first, 0, 1, seq=2, steps=steps[1:])).accepted == 2
        assert server.context is not None
        registry = server.context.registry
        assert registry.get_sample_value("smon_ingest_rejected_total", {"reason": "too_many_jobs"}) == 1
