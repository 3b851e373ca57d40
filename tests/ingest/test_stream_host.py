"""Ingest.StreamHost over real gRPC: a host relay's batches, several ranks' in one message."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import grpc
import pytest
from sqlalchemy import func, select

from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.ingest.service import RELAYED_PART_COST
from smon_server.runtime import BackgroundServer
from smon_server.store.models import Agent, IngestedBatch, StepRecord
from tests.support import factories as f
from tests.support.settings import server_settings


def _count(server: BackgroundServer, model: type) -> int:
    assert server.context is not None
    with server.context.db.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def _host_acks(server: BackgroundServer, *messages: pb.HostBatch) -> list[pb.HostAck]:
    """The HostAcks of `messages` sent on one stream, each once the one before is answered (the
    server reads ahead: sent at once, two messages could be committed in either order)."""
    answered = threading.Semaphore(0)

    def requests() -> Iterator[pb.HostBatch]:
        for i, message in enumerate(messages):
            if i:
                answered.acquire(timeout=10)
            yield message

    acks = []
    with grpc.insecure_channel(server.grpc_target) as channel:
        for ack in pb_grpc.IngestStub(channel).StreamHost(requests(), timeout=30):
            acks.append(ack)
            answered.release()
    return acks


def test_each_part_is_stored_acked_and_refused_alone(server: BackgroundServer) -> None:
    job = f.new_job_id()
    per_rank = f.dp_job_steps(4, range(5))
    per_rank[1][2].duration = math.nan  # one bad record in rank 1's part
    parts = [f.batch(job, rank, 4, steps=per_rank[rank], host="h") for rank in range(3)]
    missing_job = f.batch("", 3, 4, steps=per_rank[3])
    message = pb.HostBatch(
        seq=1,
        parts=[
            parts[0].SerializeToString(),
            parts[1].SerializeToString(),
            b"\xff\xff\xff not a batch",
            missing_job.SerializeToString(),
            parts[2].SerializeToString(),
        ],
    )
    (ack,) = _host_acks(server, message)
    assert ack.seq == 1 and len(ack.acks) == 5
    good0, bad1, garbage, no_job, good2 = ack.acks
    assert (good0.agent_id, good0.seq, good0.accepted, good0.rejected) == (parts[0].agent_id, 1, 5, 0)
    assert (bad1.accepted, bad1.rejected) == (4, 1)
    assert [(r.kind, r.index, r.reason) for r in bad1.rejections] == [("step", 2, "non_finite")]
    assert garbage.agent_id == "" and [r.reason for r in garbage.rejections] == ["malformed"]
    assert [r.reason for r in no_job.rejections] == ["missing_job"]
    assert (good2.agent_id, good2.accepted) == (parts[2].agent_id, 5)
    assert _count(server, StepRecord) == 14
    assert _count(server, Agent) == 3
    assert _count(server, IngestedBatch) == 3


def test_a_resent_part_is_stored_once_and_acked_as_duplicate(server: BackgroundServer) -> None:
    job = f.new_job_id()
    per_rank = f.dp_job_steps(2, range(3))
    first = f.batch(job, 0, 2, steps=per_rank[0])
    second = f.batch(job, 1, 2, steps=per_rank[1])
    # Rank 0's batch came by its relay, whose HostAck was lost: it resends it beside rank 1's.
    acks = _host_acks(
        server,
        pb.HostBatch(seq=1, parts=[first.SerializeToString()]),
        pb.HostBatch(seq=2, parts=[first.SerializeToString(), second.SerializeToString()]),
    )
    assert [a.seq for a in acks] == [1, 2]
    assert [(a.duplicate, a.accepted) for a in acks[1].acks] == [(True, 3), (False, 3)]
    # ... and once more on its own stream, as a rank that left its relay does.
    with grpc.insecure_channel(server.grpc_target) as channel:
        assert pb_grpc.IngestStub(channel).Push(first).duplicate
    assert _count(server, StepRecord) == 6
    assert _count(server, IngestedBatch) == 2


def test_a_malformed_host_message_is_invalid_argument(server: BackgroundServer) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.stream_stream("/smon.v1.Ingest/StreamHost")
        with pytest.raises(grpc.RpcError) as info:
            list(call(iter([b"\xff\xff\xff garbage"]), timeout=10))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_a_host_stream_counts_as_its_ranks_in_the_flush_interval(sqlite_url: str) -> None:
    """Flow control per host stream: one stream, but a replica that takes one batch a second asks
    a relay carrying four ranks to flush every 2 s: four ranks' batches, each at half the cost of
    a batch on its own stream (RELAYED_PART_COST)."""
    job = f.new_job_id()
    per_rank = f.dp_job_steps(4, range(2))
    four = [f.batch(job, r, 4, steps=per_rank[r]).SerializeToString() for r in range(4)]
    one = [f.batch(job, 0, 4, seq=2, steps=per_rank[0][:1]).SerializeToString()]
    settings = server_settings(sqlite_url, ingest_batches_per_second=1.0)
    with BackgroundServer(settings) as running:
        acks = _host_acks(running, pb.HostBatch(seq=1, parts=four), pb.HostBatch(seq=2, parts=one))
    assert [a.seq for a in acks] == [1, 2]  # no opening HostAck: one stream is within 1 batch/s
    assert [a.flush_seconds for a in acks] == [4 * RELAYED_PART_COST, 0.0]  # then one rank
