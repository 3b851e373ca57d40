"""The ingest service over real gRPC on loopback, storing into SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import math
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import psycopg
import pytest
from sqlalchemy import func, select

from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.runtime import BackgroundServer
from smon_server.store.models import Agent, GpuSample, IngestedBatch, Job, StepRecord
from smon_server.store.step_window import read_window
from tests.support import factories as f
from tests.support.settings import server_settings


@pytest.fixture
def stub(server: BackgroundServer) -> Iterator[pb_grpc.IngestStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield pb_grpc.IngestStub(channel)


def _count(server: BackgroundServer, model: type) -> int:
    assert server.context is not None
    with server.context.db.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def _metric(server: BackgroundServer, name: str, **labels: str) -> float:
    assert server.context is not None
    return server.context.registry.get_sample_value(name, labels) or 0.0


def test_push_stores_steps_agent_job_and_gpu_samples(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    job = f.new_job_id()
    steps = f.dp_job_steps(2, range(3))
    sample = pb.GpuSample(time=f.T0, gpu_index=0, sm_clock_mhz=1200, sm_clock_max_mhz=1980)
    hb = pb.Heartbeat(time=f.T0 + 5, last_step=2, current_step=3, phase="forward", phase_since=f.T0)
    ack = stub.Push(f.batch(job, 0, 2, steps=steps[0], gpu_samples=[sample], heartbeat=hb))
    assert (ack.accepted, ack.rejected, ack.duplicate) == (4, 0, False)
    assert _count(server, StepRecord) == 3
    assert _count(server, GpuSample) == 1
    assert server.context is not None
    with server.context.db.session() as session:
        stored = session.get(Job, (job, 1))
        assert stored is not None and stored.world_size == 2 and stored.last_step == 2
        agent = session.scalars(select(Agent)).one()
        assert (agent.rank, agent.hb_phase, agent.hb_current_step) == (0, "forward", 3)
        assert stored.key is not None and agent.key is not None and agent.first_step == 0
        record = read_window(session=session, job=stored, from_step=1, to_step=1)
        assert list(record.rank) == [0] and list(record.step) == [1]
        assert record.phase_table()["forward"][0] == pytest.approx(0.010)
        assert [record.kinds[k] for k in record.span_kind] == [
            "data_wait",
            "forward",
            "backward",
            "grad_sync",
            "optimizer",
        ]
    assert _metric(server, "smon_ingest_records_total", kind="step") == 3


def test_resent_batch_is_stored_once_and_acked_as_duplicate(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    job = f.new_job_id()
    b = f.batch(job, 0, 1, steps=f.dp_job_steps(1, range(4))[0])
    first = stub.Push(b)
    again = stub.Push(b)
    assert not first.duplicate and again.duplicate
    assert again.seq == b.seq
    assert _count(server, StepRecord) == 4
    assert _count(server, IngestedBatch) == 1
    # The same steps under a new batch (e.g. a restarted agent) are not stored twice either.
    renamed = f.batch(job, 0, 1, steps=b.steps, agent_id="other-agent")
    assert stub.Push(renamed).accepted == 4
    assert _count(server, StepRecord) == 4


def test_bad_records_rejected_with_reasons_valid_ones_kept(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    job = f.new_job_id()
    records = f.dp_job_steps(1, range(4))[0]
    records[1].duration = math.nan
    records[2].spans[0].duration = -1.0
    ack = stub.Push(f.batch(job, 0, 1, steps=records))
    assert (ack.accepted, ack.rejected) == (2, 2)
    assert {(r.index, r.reason) for r in ack.rejections} == {
        (1, "non_finite"),
        (2, "negative_duration"),
    }
    assert _count(server, StepRecord) == 2
    assert _metric(server, "smon_ingest_rejected_total", reason="non_finite") == 1
    assert _metric(server, "smon_ingest_rejected_total", reason="negative_duration") == 1


def test_batch_without_job_gets_batch_rejection(stub: pb_grpc.IngestStub) -> None:
    b = f.batch("", 0, 1, steps=f.dp_job_steps(1, range(2))[0])
    ack = stub.Push(b)
    assert ack.accepted == 0 and ack.rejected == 2
    assert [(r.kind, r.reason) for r in ack.rejections] == [("batch", "missing_job")]


def test_malformed_protobuf_gets_invalid_argument(server: BackgroundServer) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        push = channel.unary_unary("/smon.v1.Ingest/Push")
        with pytest.raises(grpc.RpcError) as info:
            push(b"\xff\xff\xff garbage")
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in (info.value.details() or "")
    assert _metric(server, "smon_ingest_rejected_total", reason="malformed") == 1


def test_oversized_message_gets_resource_exhausted(database_url: str) -> None:
    settings = server_settings(database_url, max_message_bytes=64 * 1024)
    with BackgroundServer(settings) as server, grpc.insecure_channel(server.grpc_target) as ch:
        records = f.dp_job_steps(1, range(2000))[0]
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.IngestStub(ch).Push(f.batch("big", 0, 1, steps=records))
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_stream_acks_each_batch_in_order(server: BackgroundServer, stub: pb_grpc.IngestStub) -> None:
    job = f.new_job_id()
    per_rank = f.dp_job_steps(2, range(6))
    requests: queue.Queue[pb.Batch | None] = queue.Queue()

    def feed() -> Iterator[pb.Batch]:
        while (item := requests.get()) is not None:
            yield item

    acks = stub.Stream(feed())
    for seq in (1, 2, 3):
        lo = (seq - 1) * 2
        requests.put(f.batch(job, 1, 2, seq=seq, steps=per_rank[1][lo : lo + 2]))
        ack = next(acks)
        assert (ack.seq, ack.accepted) == (seq, 2)
    requests.put(None)
    assert list(acks) == []
    assert _count(server, StepRecord) == 6


@pytest.mark.postgres
def test_a_streams_batches_wait_for_one_commit_together(postgres_url: str) -> None:
    """An agent keeps several batches unacked; the server takes them in while an earlier one
    commits, so they share the next commit instead of waiting one commit each."""
    job = f.new_job_id()
    per_rank = f.dp_job_steps(1, range(14))[0]
    with (
        # One writer: a second would take the next batch while the first waits (as it should).
        BackgroundServer(server_settings(postgres_url, ingest_writers=1)) as server,
        grpc.insecure_channel(server.grpc_target) as ch,
    ):
        stub = pb_grpc.IngestStub(ch)
        stub.Push(f.batch(job, 0, 1, seq=1, steps=per_rank[:2]))  # the job's row exists
        conninfo = postgres_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(conninfo) as blocker:
            # Hold the job's row: the next group's job upsert waits for it, as a slow commit would.
            blocker.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", (job,))
            batches = [
                f.batch(job, 0, 1, seq=seq, steps=per_rank[2 * seq - 2 : 2 * seq]) for seq in range(2, 8)
            ]
            acks = stub.Stream(iter(batches))
            deadline = time.monotonic() + 30
            while not _waiting_on_a_lock(blocker, postgres_url) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # the rest of the stream arrives meanwhile
            blocker.rollback()
            assert [(a.seq, a.accepted) for a in acks] == [(seq, 2) for seq in range(2, 8)]
        with server.context.db.session() as session:  # type: ignore[union-attr]
            groups = session.scalars(
                select(func.count(func.distinct(IngestedBatch.received_at))).where(
                    IngestedBatch.job_id == job, IngestedBatch.seq >= 2
                )
            ).one()
        # The batch caught by the held row commits alone (or with some of the others); the rest
        # together. Handled one at a time, each of the six would have had a commit of its own.
        assert groups <= 2
        assert _count(server, StepRecord) == 14


def _waiting_on_a_lock(connection: psycopg.Connection, database_url: str) -> bool:
    database = database_url.rsplit("/", 1)[1]
    row = connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
        (database,),
    ).fetchone()
    return bool(row and row[0])


def test_ingest_token_is_required_when_configured(database_url: str) -> None:
    settings = server_settings(database_url, ingest_token="s3cret")
    b = f.batch(f.new_job_id(), 0, 1, steps=f.dp_job_steps(1, range(1))[0])
    with BackgroundServer(settings) as server, grpc.insecure_channel(server.grpc_target) as ch:
        stub = pb_grpc.IngestStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Push(b)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError):
            stub.Push(b, metadata=[("authorization", "Bearer wrong")])
        ack = stub.Push(b, metadata=[("authorization", "Bearer s3cret")])
        assert ack.accepted == 1
        with pytest.raises(grpc.RpcError) as info:  # the clock too: it tells time to anyone otherwise
            stub.Clock(pb.ClockRequest(agent_time=1.0))
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        reply = stub.Clock(pb.ClockRequest(agent_time=1.0), metadata=[("authorization", "Bearer s3cret")])
        assert reply.agent_time == 1.0
        assert _metric(server, "smon_ingest_rejected_total", reason="unauthenticated") == 3


def test_clock_rpc_echoes_and_reports_server_time(stub: pb_grpc.IngestStub) -> None:
    reply = stub.Clock(pb.ClockRequest(agent_time=123.0))
    assert reply.agent_time == 123.0
    assert reply.server_time > f.T0 - 365 * 86400


def test_concurrent_agents_all_stored(server: BackgroundServer) -> None:
    job = f.new_job_id()
    world = 8
    per_rank = f.dp_job_steps(world, range(20))

    def agent(rank: int) -> None:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.IngestStub(channel)
            for seq in range(1, 5):
                chunk = per_rank[rank][(seq - 1) * 5 : seq * 5]
                assert stub.Push(f.batch(job, rank, world, seq=seq, steps=chunk)).accepted == 5

    threads = [threading.Thread(target=agent, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _count(server, StepRecord) == world * 20


def _refuse_step(server: BackgroundServer, step: int) -> None:
    """Make the database itself refuse any step record of `step` (a trigger raising a data error):
    content that passed validation but cannot be stored, which validation no longer lets through
    on its own (the fuzz found those and validation refuses them now)."""
    assert server.context is not None
    with server.context.db.engine.begin() as c:
        if c.dialect.name == "postgresql":
            c.exec_driver_sql(
                "CREATE OR REPLACE FUNCTION refuse_step() RETURNS trigger AS $$ BEGIN"
                f" IF NEW.step = {step} THEN RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22003';"
                " END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            c.exec_driver_sql(
                "CREATE TRIGGER refuse_step BEFORE INSERT ON step_records"
                " FOR EACH ROW EXECUTE FUNCTION refuse_step()"
            )
        else:
            c.exec_driver_sql(
                f"CREATE TRIGGER refuse_step BEFORE INSERT ON step_records WHEN NEW.step = {step}"
                " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )


def test_a_batch_the_database_refuses_is_refused_for_good_and_the_next_is_stored(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    # Valid protobuf that passes validation, but the database refuses it every time. Resent
    # forever, it would hold back every newer record.
    job = f.new_job_id()
    steps = f.dp_job_steps(1, range(4))[0]
    _refuse_step(server, 1)
    bad = f.batch(job, 0, 1, seq=1, steps=steps[:2])
    ack = stub.Push(bad)
    assert (ack.accepted, ack.rejected) == (0, 2)
    assert [(r.kind, r.reason) for r in ack.rejections] == [("batch", "storage_refused")]
    assert _metric(server, "smon_ingest_rejected_total", reason="storage_refused") == 1
    ack = stub.Push(f.batch(job, 0, 1, seq=2, steps=steps[2:]))
    assert (ack.accepted, ack.rejected) == (2, 0)
    assert _count(server, StepRecord) == 2


def test_a_seq_resent_with_other_records_is_refused_not_acked_as_stored(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    job = f.new_job_id()
    steps = f.dp_job_steps(1, range(6))[0]
    first = f.batch(job, 0, 1, seq=7, steps=steps[:3])
    assert stub.Push(first).accepted == 3
    # The same batch again, with another heartbeat (as a real resend may carry): a duplicate.
    again = f.batch(job, 0, 1, seq=7, steps=steps[:3], heartbeat=pb.Heartbeat(time=f.T0 + 9))
    ack = stub.Push(again)
    assert ack.duplicate and ack.rejected == 0
    # The same seq with other records: refused, so the agent knows they were not stored.
    reused = f.batch(job, 0, 1, seq=7, steps=steps[3:])
    ack = stub.Push(reused)
    assert (ack.accepted, ack.rejected, ack.duplicate) == (0, 3, False)
    assert [r.reason for r in ack.rejections] == ["seq_reused"]
    assert _count(server, StepRecord) == 3


def test_a_step_table_is_stored_like_the_same_records_sent_as_messages(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    """Acks tell agents the server reads StepTables; a table's records are stored exactly as the
    same records sent as messages (read back through the analysis's window)."""
    from smon.table import to_table

    steps = f.dp_job_steps(2, range(20), slow_rank=1, slow_forward=0.01)
    as_rows, as_table = f.new_job_id("rows"), f.new_job_id("table")
    ack = stub.Push(f.batch(as_rows, 0, 1, steps=steps[1]))
    assert ack.step_tables and ack.accepted == 20
    batch = f.batch(as_table, 0, 1)
    batch.step_table.CopyFrom(to_table(steps[1]))
    ack = stub.Push(batch)
    assert (ack.accepted, ack.rejected, ack.duplicate) == (20, 0, False)
    assert stub.Push(batch).duplicate  # resent: stored once
    assert server.context is not None
    with server.context.db.session() as session:
        windows = []
        for job_id in (as_rows, as_table):
            job = session.get(Job, (job_id, 1))
            assert job is not None and job.last_step == 19
            windows.append(read_window(session=session, job=job, from_step=0, to_step=19))
    rows, table = windows
    assert list(table.step) == list(rows.step) == list(range(20))
    for name in ("start_time", "duration", "span_start", "span_duration", "span_microbatch"):
        assert list(getattr(table, name)) == list(getattr(rows, name)), name
    assert [table.kinds[k] for k in table.span_kind] == [rows.kinds[k] for k in rows.span_kind]
    assert _metric(server, "smon_ingest_records_total", kind="step") == 40


def test_a_table_declaring_billions_of_records_gets_one_counted_refusal(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    """Found by test_grpc_fuzz.py: the server was OOM-killed building a rejection per declared
    record, and the whole-batch Ack's count overflowed its uint32 (an UNKNOWN status). The table
    is refused in one rejection; the record sent beside it as a message is stored."""
    b = f.batch(f.new_job_id(), 0, 1, steps=[f.dp_step(1, start=f.T0)])
    b.step_table.records = 2**32 - 1
    ack = stub.Push(b)
    assert ack.accepted == 1
    assert [(r.kind, r.reason) for r in ack.rejections] == [("step_table", "bad_table")]
    assert _metric(server, "smon_ingest_rejected_total", reason="bad_table") == 1
    assert _count(server, StepRecord) == 1


def test_a_locked_sqlite_database_refuses_a_batch_within_the_statement_timeout(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite cannot hang like a server, but another process's write lock can hold a writer:
    the statement timeout is its busy timeout, and the batch is refused (UNAVAILABLE, resent
    later) instead of waiting; the outage is one line as it begins and one as it ends."""
    settings = server_settings(sqlite_url, database_statement_timeout=1.0, analysis_interval=3600)
    steps = f.dp_job_steps(1, range(3))[0]
    with BackgroundServer(settings) as server, grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        blocker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with caplog.at_level(logging.INFO), pytest.raises(grpc.RpcError) as refused:
            stub.Push(f.batch("locked", 0, 1, steps=steps), timeout=60)
        took = time.monotonic() - started
        with caplog.at_level(logging.INFO), pytest.raises(grpc.RpcError) as ended:
            list(stub.Stream(iter([f.batch("locked", 0, 1, steps=steps)]), timeout=60))
        blocker.execute("ROLLBACK")
        blocker.close()
        with caplog.at_level(logging.INFO):
            ack = stub.Push(f.batch("locked", 0, 1, steps=steps), timeout=60)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and took < 15, took
    # A stream ended so says that nothing it left unacked was stored (the agent counts on it).
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("smon-unacked-not-stored", "1") in tuple(ended.value.trailing_metadata() or ())
    assert (ack.accepted, ack.duplicate) == (3, False)
    said = [r.getMessage() for r in caplog.records if r.name == "smon_server.store.availability"]
    assert [m.split(":")[0].split(" after")[0] for m in said] == [
        "database unavailable",
        "database available again",
    ], said
    assert "database is locked" in said[0] and "2 ingest batches refused" in said[1]
    assert not [r for r in caplog.records if r.exc_info]


def test_device_timed_spans_keep_their_host_views_in_both_wire_forms(
    server: BackgroundServer, stub: pb_grpc.IngestStub
) -> None:
    """A CUDA-timed span also says when the host issued it and for how long: stored beside the
    span (NULL for host-timed records) and read back with the window, from messages or a table."""
    from smon.table import to_table

    records = f.dp_job_steps(1, range(6))[0]
    for record in records[:4]:  # device-timed steps; the last two were timed on the host
        for i, span in enumerate(record.spans):
            span.host_start = span.start + 0.0001 * i
            span.host_duration = span.duration * 1.5
    records[1].spans[0].host_duration = math.nan  # unusable: dropped, the span kept
    windows = []
    for form in ("rows", "table"):
        job_id = f.new_job_id(form)
        batch = f.batch(job_id, 0, 1, steps=records if form == "rows" else ())
        if form == "table":
            batch.step_table.CopyFrom(to_table(records))
        ack = stub.Push(batch)
        assert (ack.accepted, ack.rejected) == (6, 0)
        assert server.context is not None
        with server.context.db.session() as session:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            windows.append(read_window(session=session, job=job, from_step=0, to_step=5))
            stored = session.scalars(
                select(StepRecord.span_host).where(StepRecord.job_key == job.key).order_by(StepRecord.step)
            ).all()
            assert [v is None for v in stored][-2:] == [True, True]
    for cols in windows:
        assert cols.has_host
        owner = cols.span_record
        device = owner < 4
        expected = cols.span_start[device] + 0.0001 * (np.arange(device.sum()) % cols.span_count[0])
        got = cols.span_host_start[device]
        usable = ~np.isnan(got)
        assert usable.sum() == device.sum() - 1  # the NaN duration dropped its span's view
        assert np.allclose(got[usable], expected[usable], atol=2e-6)
        assert np.allclose(
            cols.span_host_duration[device][usable], 1.5 * cols.span_duration[device][usable], rtol=1e-5
        )
        assert np.isnan(cols.span_host_start[~device]).all()
    assert np.array_equal(windows[0].span_host_start, windows[1].span_host_start, equal_nan=True)
