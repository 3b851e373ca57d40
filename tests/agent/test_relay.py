"""The host relay (smon/relay.py) with real sidecar processes and a real server on loopback.

The ranks of one host ship through LOCAL_RANK 0's sidecar: one stream reaches the server for all
of them, every step is stored once; the relay killed mid-run leaves the others to go direct
without losing or doubling a step; a server without StreamHost gets every rank's own stream.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from smon.config import AgentConfig, resolve_config
from smon.errors import ErrorCounter
from smon.outlet import ProcessOutlet
from smon.relay import Relay, relay_address
from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.runtime import BackgroundServer
from smon_server.store.models import StepRecord
from tests.agent.ingest_server import IngestServer
from tests.support import factories as f
from tests.support.settings import server_settings


@pytest.fixture
def server(sqlite_url: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(server_settings(sqlite_url)) as running:
        yield running


def _config(server: str, *, flush_interval: float = 0.05, heartbeat_interval: float = 0.2) -> AgentConfig:
    return AgentConfig(
        server=server,
        flush_interval=flush_interval,
        heartbeat_interval=heartbeat_interval,
        max_batch_records=1 if flush_interval > 1 else AgentConfig.max_batch_records,
        flush_timeout=5.0,
        backoff_base=0.02,
        backoff_cap=0.1,
        nvml_interval=0,
        relay=True,
        relay_fallback=1.0,
    )


def _start_host(
    server: str, job: str, ranks: int, host: str = "", config: AgentConfig | None = None
) -> list[ProcessOutlet]:
    """One host's sidecars, LOCAL_RANK 0 (the relay) first."""
    host = host or f"host-{uuid.uuid4().hex[:6]}"
    config = config or _config(server)
    return [ProcessOutlet(config, f.coords(job, rank, ranks, host=host)) for rank in range(ranks)]


def _send(outlet: ProcessOutlet, records: list[pb.StepRecord]) -> None:
    for record in records:
        outlet.send(pb.Batch(steps=[record]))


def _stored(server: BackgroundServer) -> list[tuple[int, int]]:
    """(rank, step) of every stored step record, repeats included."""
    assert server.context is not None
    with server.context.db.session() as session:
        return [(r, s) for r, s in session.execute(select(StepRecord.rank, StepRecord.step))]


def _wait(predicate: Callable[[], object], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _streams(server: BackgroundServer) -> float:
    assert server.context is not None
    return server.context.registry.get_sample_value("smon_ingest_streams") or 0.0


def _status(outlet: ProcessOutlet, key: str) -> object:
    _wait(lambda: key in outlet.status(), 5.0)
    return outlet.status().get(key)


def test_a_hosts_ranks_reach_the_server_on_one_stream(server: BackgroundServer) -> None:
    job, ranks, steps, host = f.new_job_id(), 4, 20, f"host-{uuid.uuid4().hex[:6]}"
    outlets = _start_host(server.grpc_target, job, ranks, host)
    per_rank = f.dp_job_steps(ranks, range(steps))
    try:
        for outlet, records in zip(outlets, per_rank.values(), strict=True):
            _send(outlet, records[: steps // 2])
        assert _wait(lambda: len(_stored(server)) == ranks * steps // 2)
        # Every rank is connected (each has had Acks) and the server holds one stream for them all.
        assert _wait(lambda: all(_status(o, "connected") for o in outlets))
        assert _streams(server) == 1
        assert all(_status(o, "via_relay") for o in outlets)
        for outlet, records in zip(outlets, per_rank.values(), strict=True):
            _send(outlet, records[steps // 2 :])
    finally:
        delivered = [o.close(5.0, final=True) for o in reversed(outlets)]  # the relay last
    assert delivered == [True] * ranks
    stored = _stored(server)
    assert sorted(stored) == sorted((r, s) for r in range(ranks) for s in range(steps))
    socket = relay_address(job, host, server.grpc_target).removeprefix("unix:")
    assert not Path(socket).exists()  # the relay cleaned up


def test_a_ranks_final_batch_leaves_the_relay_at_once(server: BackgroundServer) -> None:
    """A rank that ends does not wait for the others' turn: with a 30 s flush interval and the
    other rank connected but silent, its final batch is acked well inside 10 s."""
    job = f.new_job_id()
    config = _config(server.grpc_target, flush_interval=30.0, heartbeat_interval=120.0)
    relay = Relay(config, relay_address(job, "host-0", server.grpc_target), ErrorCounter())
    relay.start()
    silent: queue.SimpleQueue[pb.Batch | None] = queue.SimpleQueue()
    ending: queue.SimpleQueue[pb.Batch | None] = queue.SimpleQueue()
    channel = grpc.insecure_channel(relay.address)
    try:
        stub = pb_grpc.IngestStub(channel)
        calls = [stub.Stream(iter(q.get, None), timeout=10.0) for q in (silent, ending)]
        assert _wait(lambda: relay.members == 2, 10.0)
        ending.put(f.batch(job, 1, 2, final=True))
        ack = next(a for a in calls[1] if a.seq == 1)  # within the 10 s deadline, not the 30 s interval
        assert (ack.accepted, ack.rejected) == (0, 0)
        assert relay.host_batches == 1
    finally:
        silent.put(None)
        ending.put(None)
        relay.close(0.0)
        channel.close()


def test_a_killed_relay_leaves_its_ranks_to_go_direct_with_nothing_lost_or_doubled(
    server: BackgroundServer,
) -> None:
    job, ranks, steps = f.new_job_id(), 3, 60
    outlets = _start_host(server.grpc_target, job, ranks)
    per_rank = f.dp_job_steps(ranks, range(steps))
    relay, survivors = outlets[0], outlets[1:]
    try:
        _send(relay, per_rank[0][:5])
        assert _wait(lambda: len(_stored(server)) == 5)

        def feed(outlet: ProcessOutlet, records: list[pb.StepRecord]) -> None:
            for record in records:  # a step every 20 ms, across the kill
                outlet.send(pb.Batch(steps=[record]))
                time.sleep(0.02)

        feeders = [
            threading.Thread(target=feed, args=(o, per_rank[rank])) for rank, o in enumerate(survivors, 1)
        ]
        for thread in feeders:
            thread.start()
        assert _wait(lambda: len(_stored(server)) >= 5 + 10)  # some of the survivors' steps went by the relay
        os.kill(relay.pid, signal.SIGKILL)
        for thread in feeders:
            thread.join()
        assert _wait(lambda: not any(_status(o, "via_relay") for o in survivors))
    finally:
        delivered = [o.close(5.0, final=True) for o in survivors]
        relay.close(0.1, final=False)
    assert delivered == [True, True]
    stored = [(r, s) for r, s in _stored(server) if r != 0]
    assert len(stored) == len(set(stored))  # nothing stored twice
    assert set(stored) == {(r, s) for r in (1, 2) for s in range(steps)}  # nothing lost


def test_a_server_without_stream_host_gets_each_ranks_own_stream(ingest: IngestServer) -> None:
    job, ranks, steps = f.new_job_id(), 2, 5
    outlets = _start_host(ingest.address, job, ranks)
    per_rank = f.dp_job_steps(ranks, range(steps))
    try:
        for outlet, records in zip(outlets, per_rank.values(), strict=True):
            _send(outlet, records)
        log = ingest.servicer
        assert log.wait_for(
            lambda s: len([b for b in s.snapshot() if b.steps]) >= 2 and len(s.steps()) == ranks * steps,
            timeout=20,
        )
        assert _wait(lambda: not any(_status(o, "via_relay") for o in outlets))
    finally:
        for outlet in reversed(outlets):
            outlet.close(3.0, final=True)
    assert {b.agent_id for b in ingest.servicer.snapshot() if b.steps} == {o.agent_id for o in outlets}


@pytest.mark.parametrize(
    ("relay", "local_world_size", "on"),
    [
        ("", "8", True),
        ("", "1", False),
        ("", "", False),
        ("off", "8", False),
        ("on", "", True),
        ("maybe", "4", True),
    ],
)
def test_the_relay_is_on_where_a_host_runs_several_ranks(
    monkeypatch: pytest.MonkeyPatch, relay: str, local_world_size: str, on: bool
) -> None:
    monkeypatch.setenv("SMON_AGENT_RELAY", relay)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    assert resolve_config().relay is on
