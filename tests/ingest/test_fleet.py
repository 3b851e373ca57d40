"""A replica past what it is sized for slows its agents' flushes, and loses nothing (issue 30):
real shippers (smon/shipper.py) against a real server on loopback gRPC and the test database."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from sqlalchemy import func, select

from smon.config import AgentConfig
from smon.errors import ErrorCounter
from smon.record_queue import RecordQueue
from smon.shipper import Shipper
from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.ingest import commits
from smon_server.runtime import BackgroundServer
from smon_server.store.models import Job, StepRecord
from tests.support import factories as f
from tests.support.settings import server_settings


@contextmanager
def shippers(target: str, job: str, count: int, **config: Any) -> Iterator[list[tuple[Shipper, RecordQueue]]]:
    made = []
    for rank in range(count):
        records = RecordQueue(10_000)
        cfg = AgentConfig(server=target, backoff_base=0.02, backoff_cap=0.2, nvml_interval=0, **config)
        shipper = Shipper(
            cfg, records, f.coords(job, rank, count), lambda: pb.Heartbeat(last_step=-1), ErrorCounter()
        )
        shipper.start()
        made.append((shipper, records))
    try:
        yield made
    finally:
        for shipper, _ in made:
            shipper.close(timeout=0.5)


def feed(agents: list[tuple[Shipper, RecordQueue]], steps: int, interval: float) -> None:
    """Each rank makes a step every `interval` seconds, as training would."""
    per_rank = f.dp_job_steps(len(agents), range(steps), origin=time.time() - 3600)
    for step in range(steps):
        for rank, (_, records) in enumerate(agents):
            records.put(per_rank[rank][step])
        time.sleep(interval)


def stored(server: BackgroundServer, job: str) -> int:
    assert server.context is not None
    with server.context.db.session() as session:
        keys = select(Job.key).where(Job.job_id == job)
        return int(
            session.scalar(select(func.count()).select_from(StepRecord).where(StepRecord.job_key.in_(keys)))
            or 0
        )


def metric(server: BackgroundServer, name: str) -> float:
    assert server.context is not None
    return server.context.registry.get_sample_value(name) or 0.0


def test_more_agents_than_a_replica_takes_batches_a_second_flush_less_often(database_url: str) -> None:
    """Six agents flushing every 0.1 s against a replica sized for 2 batches a second: its Acks ask
    for 3 s, the agents send a tenth of the batches, and every record is stored once."""
    settings = server_settings(database_url, ingest_batches_per_second=2.0, analysis_interval=3600)
    job, seconds, interval = f.new_job_id("fleet"), 4.0, 0.05
    steps = int(seconds / interval)
    with BackgroundServer(settings) as server:
        with shippers(server.grpc_target, job, 6, flush_interval=0.1, heartbeat_interval=0.2) as agents:
            feed(agents, steps, interval)
            assert {s.flush_seconds for s, _ in agents} == {3.0}
            assert metric(server, "smon_ingest_streams") == 6
            assert metric(server, "smon_ingest_flush_seconds") == 3.0
            # What the analysis loop reads before it takes a spare worker: the ingest at capacity.
            assert server.context is not None and server.context.ingest_load() == 1.0
            for shipper, _ in agents:
                assert shipper.close(timeout=15.0)
            sent = [s.sent_batches for s, _ in agents]
            dropped = [s.local_dropped() for s, _ in agents]
        # Unasked, each would send a batch every 0.1 s: ~40 in 4 s. Asked for 3 s: a few.
        assert max(sent) <= 10, sent
        assert dropped == [0] * 6
        assert stored(server, job) == 6 * steps


def test_batches_waiting_over_a_second_to_commit_make_acks_throttle(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each group commit takes 1.2 s (a database that cannot keep up): batches wait past
    OVERLOAD_SECONDS, the Acks carry throttle_seconds, the agents hold back, nothing is lost."""
    slow_write: Callable[..., Any] = commits.write_batches

    def slowly(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.2)
        return slow_write(*args, **kwargs)

    monkeypatch.setattr(commits, "write_batches", slowly)
    settings = server_settings(database_url, analysis_interval=3600, ingest_writers=1)
    job, steps = f.new_job_id("overload"), 60
    with BackgroundServer(settings) as server:
        with shippers(server.grpc_target, job, 3, flush_interval=0.05, heartbeat_interval=0.2) as agents:
            feed(agents, steps, 0.05)
            for shipper, _ in agents:
                assert shipper.close(timeout=30.0)
            throttled = [s.throttled for s, _ in agents]
            dropped = [s.local_dropped() for s, _ in agents]
        assert all(t > 0 for t in throttled), throttled
        assert metric(server, "smon_ingest_overloaded_acks_total") > 0
        assert dropped == [0] * 3
        assert stored(server, job) == 3 * steps


def test_a_replica_past_its_size_says_so_as_a_stream_opens(database_url: str) -> None:
    """Before any batch (an Ack of seq 0): a fleet that starts at once learns its flush interval
    without waiting for Acks queued behind its own first batches."""
    settings = server_settings(database_url, ingest_batches_per_second=0.5, analysis_interval=3600)
    with BackgroundServer(settings) as server, grpc.insecure_channel(server.grpc_target) as channel:
        requests: queue.Queue[pb.Batch | None] = queue.Queue()

        def feed() -> Iterator[pb.Batch]:
            while (item := requests.get()) is not None:
                yield item

        acks = pb_grpc.IngestStub(channel).Stream(feed())
        hello = next(acks)
        assert (hello.seq, hello.flush_seconds, hello.accepted) == (0, 2.0, 0)
        # ... and spreads the streams' first batches over the interval: each is held a random
        # part of it (more streams, each told on opening).
        others = [next(pb_grpc.IngestStub(channel).Stream(iter(()))) for _ in range(6)]
        holds = [(a.throttle_seconds, a.flush_seconds) for a in [hello, *others]]
        assert all(0.0 <= hold <= flush for hold, flush in holds), holds
        assert len({hold for hold, _ in holds}) == len(holds), holds
        job = f.new_job_id("hello")
        requests.put(f.batch(job, 0, 1, seq=1, steps=f.dp_job_steps(1, range(3))[0]))
        ack = next(acks)
        assert (ack.seq, ack.accepted, ack.flush_seconds) == (1, 3, 2.0)
        requests.put(None)
        assert list(acks) == []
