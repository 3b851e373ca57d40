"""Shipping against a real gRPC server on loopback: batching, acks, resend, drops, flush, auth, clock."""

from __future__ import annotations

import itertools
import time

import grpc
import pytest

from smon.shipper import backoff_delay
from smon.v1 import ingest_pb2 as pb
from tests.agent.conftest import unused_port
from tests.agent.ingest_server import IngestServer, RecordingIngest


def record_batches(servicer: RecordingIngest) -> list[pb.Batch]:
    return [b for b in servicer.snapshot() if b.steps or b.gpu_samples]


def test_batches_by_count_with_increasing_seq_and_acks(ingest, attach_fast):
    mon = attach_fast(server=ingest.address, max_batch_records=10, flush_interval=0.5)
    for _ in range(35):
        mon.step()
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == list(range(35)))
    batches = record_batches(ingest.servicer)
    assert all(len(b.steps) <= 10 for b in batches)
    assert sum(len(b.steps) for b in batches) == 35  # each step stored once
    seqs = [b.seq for b in ingest.servicer.snapshot()]
    assert seqs[0] == 1 and seqs == sorted(set(seqs))
    assert {b.agent_id for b in batches} == {batches[0].agent_id}
    mon.close()
    counters = mon.counters()
    assert counters["acked_batches"] == len(batches) + 1  # and the final batch
    assert counters["dropped_records"] == 0 and counters["errors"] == 0 and counters["queued"] == 0


def test_batches_by_time(ingest, attach_fast):
    mon = attach_fast(server=ingest.address, flush_interval=0.3, max_batch_records=1000)
    for _ in range(5):
        mon.step()
        time.sleep(0.01)
    ended = time.time()
    assert ingest.servicer.wait_for(lambda s: len(s.step_numbers()) == 5)
    batches = record_batches(ingest.servicer)
    assert len(batches) <= 2  # five steps 10 ms apart share a batch
    # Sent by time: the monitor is still open and the batch is far from full, so only the flush
    # interval (0.3 s) can have sent it; the bound only says "not stuck" (a loaded machine's
    # threads can run a second late).
    assert batches[-1].sent_time - ended < 5.0


def test_throttled_ack_holds_records_back_then_sends_larger_batches(ingest, attach_fast):
    hold = 0.6
    ingest.servicer.throttle_next = hold
    mon = attach_fast(server=ingest.address, max_batch_records=5, flush_interval=0.05)
    mon.step()  # its batch's Ack asks for the hold; connected first, however slow the machine
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == [0])
    for _ in range(39):
        mon.step()
        time.sleep(0.01)
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == list(range(40)))
    with ingest.servicer._lock:
        arrivals = [
            (t, len(b.steps))
            for t, b in zip(ingest.servicer.received_at, ingest.servicer.batches, strict=True)
            if b.steps
        ]
    # The first Ack said hold back: after the batches already in flight, nothing with records came
    # while the hold lasted, and what piled up meanwhile came in batches larger than
    # max_batch_records (only a throttled agent cuts those).
    gaps = [(later[0] - earlier[0], later[1]) for earlier, later in itertools.pairwise(arrivals)]
    gap, after = max(gaps)
    assert gap >= 0.9 * hold, arrivals
    assert after > 5, arrivals
    mon.close()
    assert mon.counters()["dropped_records"] == 0


def test_resends_unacked_batch_with_same_seq_after_stream_drop(ingest, attach_fast):
    ingest.servicer.drop_streams_on_records = 1
    mon = attach_fast(server=ingest.address)
    for _ in range(5):
        mon.step()
    assert ingest.servicer.wait_for(lambda s: len(record_batches(s)) >= 2)
    assert ingest.servicer.step_numbers() == [0, 1, 2, 3, 4]
    received = record_batches(ingest.servicer)
    first = received[0]
    again = [b for b in received[1:] if b.seq == first.seq]
    assert again and again[0] == first  # resent unchanged, so the server can dedupe it
    mon.close()
    assert mon.counters()["resent_batches"] >= 1
    assert mon.counters()["dropped_records"] == 0


def test_no_step_lost_across_server_restart(attach_fast):
    first = IngestServer(RecordingIngest()).start()
    mon = attach_fast(server=first.address)
    for _ in range(5):
        mon.step()
    assert first.servicer.wait_for(lambda s: len(s.step_numbers()) == 5)
    first.servicer.ack = False  # the next batches arrive but are never acked...
    for _ in range(5):
        mon.step()
    assert first.servicer.wait_for(lambda s: len(s.step_numbers()) == 10)
    unacked = {b.seq: b for b in record_batches(first.servicer) if b.steps[0].step >= 5}
    first.stop()  # ...and the server goes away
    for _ in range(5):
        mon.step()
    time.sleep(0.2)
    second = IngestServer(RecordingIngest(), port=first.port).start()
    try:
        assert second.servicer.wait_for(lambda s: set(range(5, 15)) <= set(s.step_numbers()))
        resent = {b.seq: b for b in record_batches(second.servicer) if b.seq in unacked}
        assert resent == unacked  # same seq, same content
        mon.close()
        assert set(first.servicer.step_numbers()) | set(second.servicer.step_numbers()) == set(range(15))
    finally:
        second.stop()


def test_reconnects_within_seconds_of_the_server_coming_back(attach_fast):
    # With the default backoff (not the tests' fast one): after 10 s of failed connects the delay
    # has reached its cap, which must stay a couple of seconds (a 30 s cap lost most records of
    # agents that exited soon after a server restart).
    port = unused_port()
    mon = attach_fast(server=f"127.0.0.1:{port}", backoff_base=None, backoff_cap=None)
    mon.step()
    time.sleep(10)
    server = IngestServer(RecordingIngest(), port=port).start()
    try:
        assert server.servicer.wait_for(lambda s: s.step_numbers() == [0], timeout=5)
    finally:
        server.stop()


def test_queue_full_drops_oldest_and_reports_the_count(attach_fast):
    port = unused_port()
    mon = attach_fast(server=f"127.0.0.1:{port}", queue_size=5)
    for _ in range(20):
        mon.step()
    assert mon.counters()["dropped_records"] == 15
    server = IngestServer(RecordingIngest(), port=port).start()
    try:
        assert server.servicer.wait_for(lambda s: s.step_numbers() == [15, 16, 17, 18, 19])
        assert record_batches(server.servicer)[0].counters.dropped_records == 15
    finally:
        mon.close()
        server.stop()


def shipper_log(capfd) -> str:
    """What the shipper process wrote to stderr (its log lines end with '[smon shipper, rank N]')."""
    return capfd.readouterr().err


def test_server_absent_for_the_whole_run(attach_fast, capfd):
    mon = attach_fast(server=f"127.0.0.1:{unused_port()}", queue_size=50)
    for _ in range(200):
        mon.step()
        with mon.phase("custom"):
            pass
    time.sleep(0.3)  # a few reconnect attempts
    started = time.monotonic()
    mon.close(timeout=0.5)
    assert time.monotonic() - started < 2.5  # bounded flush, then give up
    counters = mon.counters()
    assert counters["dropped_records"] == 200  # most by the full queues, the rest at exit
    assert counters["errors"] == 0
    assert shipper_log(capfd).count("cannot reach") == 1  # said once, not per retry


def test_records_a_server_may_have_stored_are_unconfirmed_at_exit_not_dropped(ingest, attach_fast, capfd):
    """A server that takes batches in and never answers (a database that hangs behind it) may
    store them after the agent gave up: they are not counted as dropped."""
    ingest.servicer.ack = False
    mon = attach_fast(server=ingest.address)
    for _ in range(20):
        mon.step()
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == list(range(20)))
    mon.close(timeout=0.5)
    counters = mon.counters()
    assert (counters["dropped_records"], counters["unconfirmed_records"]) == (0, 20)
    log = shipper_log(capfd)
    assert "dropped 0 records" in log and "20 more were sent but not confirmed" in log


def test_records_a_server_said_it_did_not_store_are_dropped_at_exit(ingest, attach_fast):
    """SMon's server ends a failed stream saying that nothing it left unacked was stored: those
    records are counted as dropped, for certain, when the agent exits before a resend lands."""
    servicer = ingest.servicer
    servicer.drop_streams_on_records = 1
    servicer.verdict_on_drop = True
    servicer.hold_clock_after_drop = True  # the next stream never opens: no resend in doubt
    mon = attach_fast(server=ingest.address)
    for _ in range(20):
        mon.step()
    assert servicer.wait_for(lambda s: s.drop_streams_on_records == 0)
    time.sleep(0.3)  # every step is cut into a batch that waits for the next stream
    mon.close(timeout=0.5)
    deadline = time.monotonic() + 5  # the shipper's last status may come just after close
    while mon.counters()["dropped_records"] < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    counters = mon.counters()
    assert (counters["dropped_records"], counters["unconfirmed_records"]) == (20, 0)


def test_close_flushes_what_it_holds(ingest, attach_fast):
    # Intervals far longer than the test: only close() can make these steps go out.
    mon = attach_fast(server=ingest.address, flush_interval=30, heartbeat_interval=30)
    assert ingest.servicer.wait_for(lambda s: s.clock_calls > 0)
    for _ in range(3):
        mon.step()
    started = time.monotonic()
    mon.close(timeout=3)
    assert time.monotonic() - started < 3
    assert ingest.servicer.step_numbers() == [0, 1, 2]
    assert mon.counters()["queued"] == 0


def test_last_batch_is_marked_final(ingest, attach_fast):
    mon = attach_fast(server=ingest.address)
    mon.step()
    mon.close()
    batches = ingest.servicer.snapshot()
    assert batches[-1].final and not batches[-1].steps
    assert [b.seq for b in batches if b.final] == [batches[-1].seq]  # exactly one
    assert ingest.servicer.step_numbers() == [0]


def test_close_with_nothing_to_send_and_no_server_is_immediate(attach_fast):
    mon = attach_fast(server=f"127.0.0.1:{unused_port()}")
    started = time.monotonic()
    mon.close(timeout=10)
    # It must not wait out its timeout for a server that is not there; the margin is wide
    # because a busy 2-core machine can stall any thread for a second.
    assert time.monotonic() - started < 5


def test_token_sent_as_bearer_metadata(attach_fast, monkeypatch):
    server = IngestServer(RecordingIngest(token="s3cret")).start()
    try:
        monkeypatch.setenv("SMON_TOKEN", "s3cret")
        mon = attach_fast(server=server.address)
        mon.step()
        assert server.servicer.wait_for(lambda s: s.step_numbers() == [0])
        assert server.servicer.metadata[0]["authorization"] == "Bearer s3cret"
        mon.close()
    finally:
        server.stop()


def test_wrong_token_is_said_once_and_training_goes_on(attach_fast, capfd):
    server = IngestServer(RecordingIngest(token="right")).start()
    try:
        mon = attach_fast(server=server.address, token="wrong")
        for _ in range(3):
            mon.step()
        assert server.servicer.wait_for(lambda s: len(server.servicer.metadata) >= 3)
        mon.close(timeout=0.3)
        assert shipper_log(capfd).count("refused") == 1
        assert server.servicer.steps() == []
    finally:
        server.stop()


def test_heartbeat_while_no_step_completes(ingest, attach_fast):
    mon = attach_fast(server=ingest.address, heartbeat_interval=0.05)
    mon.step()  # step 0 done; step 1 hangs in a checkpoint
    with mon.phase("checkpoint"):
        entered = time.time()

        def stuck(s: RecordingIngest) -> bool:
            return any(
                b.heartbeat.phase == "checkpoint" and b.heartbeat.time > entered + 0.15 for b in s.snapshot()
            )

        assert ingest.servicer.wait_for(stuck)
    beat = next(b.heartbeat for b in ingest.servicer.snapshot() if b.heartbeat.phase == "checkpoint")
    assert beat.last_step == 0 and beat.current_step == 1
    assert beat.phase_since == pytest.approx(entered, abs=0.05)
    assert ingest.servicer.step_numbers() == [0]


def test_clock_offset_estimate(attach_fast):
    server = IngestServer(RecordingIngest(clock_offset=5.0)).start()
    try:
        mon = attach_fast(server=server.address)
        mon.step()
        assert server.servicer.wait_for(lambda s: bool(s.steps()))
        assert record_batches(server.servicer)[0].clock_offset == pytest.approx(5.0, abs=0.02)
        assert server.servicer.clock_calls >= 3  # several round trips, the shortest wins
        mon.close()
    finally:
        server.stop()


def test_rejections_logged_once_per_reason_and_not_resent(ingest, attach_fast, capfd):
    ingest.servicer.rejection = pb.Rejection(
        kind="step", index=0, reason="negative_duration", detail="duration < 0"
    )
    mon = attach_fast(server=ingest.address)
    for i in range(3):
        mon.step()
        assert ingest.servicer.wait_for(lambda s, n=i: len(s.step_numbers()) == n + 1)
    mon.close()
    assert shipper_log(capfd).count("negative_duration") == 1
    assert mon.counters()["resent_batches"] == 0


def test_batch_the_server_refuses_as_invalid_is_dropped_not_retried_forever(ingest, attach_fast):
    ingest.servicer.drop_streams_on_records = 1
    ingest.servicer.abort_code = grpc.StatusCode.INVALID_ARGUMENT
    mon = attach_fast(server=ingest.address)
    mon.step()
    assert ingest.servicer.wait_for(lambda s: len(record_batches(s)) == 1)
    mon.step()
    assert ingest.servicer.wait_for(lambda s: 1 in s.step_numbers())
    mon.close()
    assert mon.counters()["dropped_records"] == 1
    assert [len(b.steps) for b in record_batches(ingest.servicer)] == [1, 1]


def test_backoff_is_jittered_exponential_and_capped():
    assert backoff_delay(0, 0.5, 30, rng=lambda: 1.0) == 0.5
    assert backoff_delay(3, 0.5, 30, rng=lambda: 1.0) == 4.0
    assert backoff_delay(50, 0.5, 30, rng=lambda: 1.0) == 30.0
    assert backoff_delay(5, 0.5, 30, rng=lambda: 0.25) == 4.0


def test_records_travel_as_step_tables_once_the_server_reads_them(ingest, attach_fast):
    """The first batch goes as messages (an older server would drop a table unread); after an Ack
    that says `step_tables`, records go as one StepTable per batch, each step exactly once."""
    ingest.servicer.step_tables = True
    mon = attach_fast(server=ingest.address, max_batch_records=10, flush_interval=0.2)
    for _ in range(5):
        mon.step()
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == list(range(5)))
    deadline = time.monotonic() + 10
    while mon.counters()["acked_batches"] < 1 and time.monotonic() < deadline:  # the Ack is read
        time.sleep(0.02)
    for _ in range(40):
        mon.step()
    assert ingest.servicer.wait_for(lambda s: s.step_numbers() == list(range(45)))
    mon.close()
    snapshot = ingest.servicer.snapshot()
    first = min((b for b in snapshot if b.steps or b.step_table.records), key=lambda b: b.seq)
    assert first.steps and not first.step_table.records
    later = [b for b in ingest.servicer.snapshot() if b.seq > first.seq and (b.steps or b.step_table.records)]
    assert later and all(b.step_table.records and not b.steps for b in later)
    sent = sum(len(b.steps) + b.step_table.records for b in ingest.servicer.snapshot())
    assert sent == 45  # nothing twice


@pytest.mark.parametrize("setting", ["gzip", None])
def test_compression_is_off_unless_asked_for(attach_fast, monkeypatch, setting):
    # A server that accepts uncompressed messages only: gzip-compressed batches never get through.
    plain_only = [("grpc.compression_enabled_algorithms_bitset", 1)]
    server = IngestServer(RecordingIngest(), options=plain_only).start()
    try:
        if setting is not None:
            monkeypatch.setenv("SMON_AGENT_COMPRESSION", setting)
        mon = attach_fast(server=server.address)
        for _ in range(20):
            mon.step()
        delivered = server.servicer.wait_for(lambda s: s.step_numbers() == list(range(20)), timeout=3)
        mon.close(timeout=0.5)
        assert delivered == (setting != "gzip")
    finally:
        server.stop()


def test_an_unknown_compression_is_said_and_ignored(monkeypatch, caplog):
    from smon.config import resolve_config

    monkeypatch.setenv("SMON_AGENT_COMPRESSION", "zstd")
    assert resolve_config().compression == "none"
    assert "SMON_AGENT_COMPRESSION" in caplog.text
    assert resolve_config(compression="GZIP").compression == "gzip"


def test_flush_policy_stretches_to_what_the_server_asks_within_the_cap():
    from smon.config import AgentConfig
    from smon.shipper import MAX_FLUSH_SECONDS, flush_policy

    config = AgentConfig(flush_interval=1.0, heartbeat_interval=2.0)
    assert flush_policy(config, 0.0) == (1.0, 2.0)
    assert flush_policy(config, 1.5) == (1.5, 2.0)
    assert flush_policy(config, 5.0) == (5.0, 5.0)
    assert flush_policy(config, 1e9) == (MAX_FLUSH_SECONDS, MAX_FLUSH_SECONDS)  # time to flag stays bounded
    assert flush_policy(config, float("nan")) == (1.0, 2.0)
    assert flush_policy(config, -3.0) == (1.0, 2.0)
