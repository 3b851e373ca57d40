"""Delivery of wire records to the SMon server over the `Ingest.Stream` bidi stream.

Runs in the shipper process (`smon.sidecar`), or in the training process as a fallback. One daemon
thread owns the connection: it opens a channel, estimates the clock offset, opens the stream and
reads Acks. gRPC consumes the request generator (`_requests`) on its own thread; that generator
cuts batches of StepRecords / GpuSamples from the record queue by count and by time and adds the
latest heartbeat to each.

Delivery rules (DESIGN §4, §8):
- Each batch carries (agent_id, seq) and is kept until the server acks that seq; after a reconnect
  the kept batches are resent unchanged, so the server can store each once. Heartbeat-only batches
  are not kept: a stale heartbeat is worth nothing. Seq numbers therefore may have gaps.
- gRPC's retry policy does not cover a started stream, so reconnects are ours: full-jitter
  exponential backoff, capped.
- At most `max_unacked_batches` are in flight; past that, records wait in the bounded queue, which
  drops its oldest when full (counted in AgentCounters.dropped_records).
- An Ack with `throttle_seconds` (the server's writes are behind) holds records back that long
  (capped); they then go out in fewer, larger batches. Heartbeats and close() are not held.
- An Ack's `flush_seconds` (a server serving more agents than it takes batches a second) makes
  the shipper flush and heartbeat no more often than that, at most MAX_FLUSH_SECONDS; the server
  may send it before any batch, in an Ack of seq 0.
- close() flushes for at most `flush_timeout` seconds, then gives up and says what was lost. Its
  last batch carries `final = true` (the server then knows this agent ended rather than died);
  close waits for that ack only while a connection is up, so an absent server costs no exit delay
  beyond the records it could not deliver.
- What is lost at exit is counted truthfully. A record that never left (still queued, or only in
  batches no server could have read) is `dropped`. One in a batch sent on a stream that ended
  without a verdict (cancelled by close, a connection cut, a server killed) may have been stored:
  it is `unconfirmed`, never `dropped`. A stream the server ends with an error carries, from this
  version on, the promise that nothing it left unacked was stored (UNSTORED_METADATA): its
  batches stay certain.
- Connection trouble is one warning line per episode (from the first failure to the next Ack),
  with the likely cause where gRPC's words hide it (smon/connection_faults.py): a TLS mismatch,
  an untrusted certificate.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from smon import table
from smon.clock_offset import estimate_offset
from smon.config import AgentConfig
from smon.connection_faults import hint
from smon.errors import ErrorCounter, OnceLog
from smon.record_queue import RecordQueue
from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc

logger = logging.getLogger("smon")

# Keepalive as in grpc's examples/python/keep_alive: detect a silently dead connection (server
# host gone, NAT dropped) within ~40 s. The server must permit pings this often
# (grpc.http2.min_recv_ping_interval_without_data_ms <= 30000, grpc.keepalive_permit_without_calls).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", 32 * 1024 * 1024),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
]

MAX_THROTTLE_SECONDS = 10.0
# The longest flush interval a server may ask for (Ack.flush_seconds): with the analysis interval
# (10 s) on top, a straggler is still flagged within 30 s.
MAX_FLUSH_SECONDS = 10.0
# For a while after a throttle, batches may hold this many times max_batch_records (the server
# accepts 10,000 records per batch by default; 4 x 256 stays well inside).
THROTTLED_BATCH_FACTOR = 4
THROTTLED_FOR_SECONDS = 30.0

# A stream that fails with one of these codes would fail again with the same batch: drop it.
_POISON_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED})
_AUTH_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
# Trailing metadata of a stream the server ended: no batch it left unacked was stored
# (smon_server/ingest/service.py).
UNSTORED_METADATA = ("smon-unacked-not-stored", "1")


def says_unstored(exc: grpc.RpcError) -> bool:
    try:
        trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    except Exception:
        return False
    return any(tuple(pair) == UNSTORED_METADATA for pair in trailing or ())


def open_channel(config: AgentConfig, target: str | None = None) -> grpc.Channel:
    """A channel to the server, or to `target` (a host relay's Unix socket: no TLS, it never
    leaves the host)."""
    if target is not None:
        return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    if not config.tls:
        return grpc.insecure_channel(config.server, options=CHANNEL_OPTIONS)
    roots = Path(config.tls_ca_file).read_bytes() if config.tls_ca_file else None  # None: system roots
    return grpc.secure_channel(config.server, grpc.ssl_channel_credentials(roots), options=CHANNEL_OPTIONS)


def flush_policy(config: AgentConfig, asked: float) -> tuple[float, float]:
    """(flush interval, heartbeat interval) in seconds: the configured ones, stretched to what the
    server's last Ack asked for (a server that serves more agents than it takes batches a second
    asks each to flush less often; the records then travel in fewer, larger batches), capped."""
    asked = min(max(asked, 0.0), MAX_FLUSH_SECONDS) if asked == asked else 0.0  # NaN: ignored
    return max(config.flush_interval, asked), max(config.heartbeat_interval, asked)


def backoff_delay(failures: int, base: float, cap: float, rng: Callable[[], float] = random.random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base·2^failures)]."""
    return rng() * min(cap, base * (2.0 ** min(failures, 30)))


class _Session:
    """One channel + stream attempt."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.acked = False
        self.sent: list[int] = []  # seqs of the batches given to this stream
        self.verdict = False  # the stream ended with every unacked batch known not stored


class Shipper:
    """Owns the record queue's consumer side, the gRPC connection and the unacked batches."""

    def __init__(
        self,
        config: AgentConfig,
        records: RecordQueue,
        coords: pb.Coordinates,
        heartbeat: Callable[[], pb.Heartbeat],
        errors: ErrorCounter,
        *,
        agent_id: str | None = None,
        upstream: Callable[[], pb.AgentCounters] | None = None,
        relay: str | None = None,
    ) -> None:
        self.agent_id = agent_id or uuid.uuid4().hex
        # The host relay's address (smon/relay.py), or None: this agent's own stream to the server.
        self._relay = relay
        self._relay_trouble_since: float | None = None
        self.went_direct = False
        self._upstream = upstream  # counters of the training process feeding this shipper
        self._config = config
        self._records = records
        self._coords = pb.Coordinates()
        self._coords.CopyFrom(coords)
        self._heartbeat = heartbeat
        self._errors = errors
        self._once = OnceLog()
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {config.token}"),) if config.token else ()
        )
        self._lock = threading.Lock()
        self._progress = threading.Condition()
        self._unacked: dict[int, tuple[pb.Batch, int]] = {}  # seq -> (batch, records); insertion order
        self._in_doubt: set[int] = set()  # unacked seqs sent on a stream that ended without verdict
        self._session_now: _Session | None = None
        self._unconfirmed = 0  # records given up at exit that may have been stored
        self._trouble_since: float | None = None  # monotonic start of the connection episode
        self._trouble_codes: set[str] = set()  # the codes already logged in this episode
        self._cutting = False  # records are between the queue and _unacked (close must wait)
        self._connected = False  # a stream is open and has acked at least once
        self._final_seq = 0  # seq of the batch marked final, once cut
        self._final_wanted = True
        self._seq = 0
        self._step_tables = False  # set by the first Ack that says the server reads StepTables
        self._clock_offset = 0.0
        self._clock_checked_at = float("-inf")
        self._dropped_undeliverable = 0
        self.resent_batches = 0
        self.sent_batches = 0
        self.acked_batches = 0
        self._kick = threading.Event()
        self._closing = threading.Event()
        self._stop = threading.Event()
        self._call: Any = None
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._hold_until = 0.0  # monotonic time before which records are held back (throttle)
        self.flush_seconds = 0.0  # the flush interval the server's last Ack asked for (0: none)
        self.throttled = 0  # Acks that asked this agent to hold back

    # -- public --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="smon-shipper", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Wake the batcher early (a full batch is queued)."""
        self._kick.set()

    @property
    def clock_offset(self) -> float:
        return self._clock_offset

    def set_gpu_uuid(self, gpu_uuid: str) -> None:
        with self._lock:
            if not self._coords.gpu_uuid:
                self._coords.gpu_uuid = gpu_uuid

    @property
    def connected(self) -> bool:
        return self._connected

    def local_dropped(self) -> int:
        return self._records.dropped + self._dropped_undeliverable

    @property
    def unconfirmed_records(self) -> int:
        """Records given up at exit that were sent and may have been stored (never `dropped`)."""
        return self._unconfirmed

    def local_queued(self) -> int:
        return len(self._records)

    def counters(self) -> pb.AgentCounters:
        """Cumulative agent health as sent: this shipper's numbers plus the training side's."""
        up = self._upstream() if self._upstream is not None else pb.AgentCounters()
        return pb.AgentCounters(
            dropped_records=up.dropped_records + self.local_dropped(),
            errors=up.errors + self._errors.count,
            queued=up.queued + self.local_queued(),
            resent_batches=self.resent_batches,
        )

    def close(self, timeout: float, *, final: bool = True) -> bool:
        """Flush for at most `timeout` seconds, then stop. Returns whether everything was acked.

        `final`: end with a batch marked final (a clean shutdown, not a crash of the trainer)."""
        thread = self._thread
        if thread is None:
            return True
        self._final_wanted = final
        self._closing.set()
        self._kick.set()
        deadline = time.monotonic() + max(0.0, timeout)
        with self._progress:
            while not self._drained() and time.monotonic() < deadline:
                self._progress.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        delivered = self._drained()
        self._stop.set()
        self._kick.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        thread.join(timeout=1.0)
        self._thread = None
        if not delivered:
            with self._lock:
                doubtful = set(self._in_doubt)
                live = self._session_now
                if live is not None and not live.ended.is_set():
                    doubtful.update(live.sent)  # the stream close() cancelled: no verdict
                unconfirmed = sum(n for seq, (_, n) in self._unacked.items() if seq in doubtful)
                kept = sum(n for _, n in self._unacked.values()) - unconfirmed
                self._unacked.clear()
                self._in_doubt.clear()
                self._dropped_undeliverable += kept
                self._unconfirmed += unconfirmed
            lost = kept + self._records.discard_all()  # the queue counts its own drops
            logger.warning(
                "smon: dropped %d records: not delivered to %s before exit (flush timeout %.1fs)%s",
                lost,
                self._config.server,
                timeout,
                f"; {unconfirmed} more were sent but not confirmed (the server may have stored them)"
                if unconfirmed
                else "",
            )
        return delivered

    # -- connection loop -----------------------------------------------------------------------
    def _drained(self) -> bool:
        """Nothing left to deliver, and the final batch acked (or no connection to send it on)."""
        with self._lock:
            if self._unacked or self._cutting or len(self._records):
                return False
            return bool(self._final_seq) or not self._final_wanted or not self._connected

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                acked = self._session()
            except Exception as exc:  # a bug of ours, not a network error: count it, keep going
                self._errors.report("shipper", exc)
                acked = False
            if self._stop.is_set():
                break
            self._failures = 0 if acked else self._failures + 1
            delay = backoff_delay(self._failures, self._config.backoff_base, self._config.backoff_cap)
            if self._closing.is_set():
                self._stop.wait(min(delay, 0.05))
            else:
                self._closing.wait(delay)  # close() cuts the wait short for a last flush attempt

    def _channel(self) -> grpc.Channel:
        return open_channel(self._config, self._relay)

    @property
    def via_relay(self) -> bool:
        """Whether batches go to the host's relay now (False: this agent's own stream)."""
        return self._relay is not None

    def _relay_failed(self, exc: grpc.RpcError) -> None:
        """Leave the relay for a direct stream, for good, when it refuses (the server lacks
        StreamHost) or cannot be reached for `relay_fallback` seconds (its process is gone). A relay
        that answers but whose server is away is waited for, as the server would be."""
        from smon.relay import RELAY_REFUSED, RELAY_UPSTREAM

        details = (exc.details() if hasattr(exc, "details") else "") or ""
        if details.startswith(RELAY_REFUSED):
            self._go_direct(details)
            return
        if details.startswith(RELAY_UPSTREAM):
            self._relay_trouble_since = None
            return
        now = time.monotonic()
        if self._relay_trouble_since is None:
            self._relay_trouble_since = now
        elif now - self._relay_trouble_since >= self._config.relay_fallback:
            self._go_direct(f"the host's relay has not answered for {now - self._relay_trouble_since:.1f}s")

    def _go_direct(self, why: str) -> None:
        logger.info("smon: shipping directly to %s (%s)", self._config.server, why)
        self._relay = None
        self.went_direct = True
        self._failures = 0

    def _session(self) -> bool:
        session = _Session()
        with self._lock:
            self._session_now = session
        channel = self._channel()
        try:
            stub = pb_grpc.IngestStub(channel)
            self._refresh_clock(stub, required=True)
            call = stub.Stream(
                self._requests(session, stub),
                metadata=self._metadata,
                compression=grpc.Compression.Gzip if self._config.compression == "gzip" else None,
            )
            with self._lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()
            for ack in call:
                if not session.acked:
                    self._end_trouble()
                    self._relay_trouble_since = None
                session.acked = True
                self._connected = True
                self._on_ack(ack)
            session.verdict = True  # a stream that ends cleanly has acked all it read
        except grpc.RpcError as exc:
            session.verdict = says_unstored(exc)
            if self._relay is not None:
                self._relay_failed(exc)  # the relay's troubles are its own to report
            else:
                self._on_rpc_error(exc)
        finally:
            with self._lock:
                if not session.verdict:
                    self._in_doubt.update(seq for seq in session.sent if seq in self._unacked)
                session.ended.set()
            self._connected = False
            self._kick.set()  # let a generator blocked in wait() see the end
            with self._progress:
                self._progress.notify_all()
            with self._lock:
                self._call = None
            channel.close()
        return session.acked

    def _refresh_clock(self, stub: Any, *, required: bool = False) -> None:
        try:
            estimate = estimate_offset(
                stub,
                samples=self._config.clock_samples,
                timeout=self._config.rpc_timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._once(
                    "clock_unimplemented",
                    logging.INFO,
                    "smon: server has no Clock RPC; clock offset reported as %.3f",
                    self._clock_offset,
                )
                self._clock_checked_at = time.monotonic()
                return
            if required:
                raise  # the server is not there: fail the session before opening the stream
            return
        self._clock_offset = estimate.offset
        self._clock_checked_at = time.monotonic()

    def _trouble(self, code: object) -> bool:
        """Whether this failure is the first of its code in the current episode (then log it)."""
        if self._trouble_since is None:
            self._trouble_since = time.monotonic()
        key = str(code)
        if key in self._trouble_codes:
            return False
        self._trouble_codes.add(key)
        return True

    def _end_trouble(self) -> None:
        if self._trouble_since is not None:
            logger.info(
                "smon: connected to %s again after %.1fs",
                self._config.server,
                time.monotonic() - self._trouble_since,
            )
        self._trouble_since = None
        self._trouble_codes.clear()

    def _on_rpc_error(self, exc: grpc.RpcError) -> None:
        code = exc.code() if hasattr(exc, "code") else None
        if self._stop.is_set() or code == grpc.StatusCode.CANCELLED:
            return
        details = exc.details() if hasattr(exc, "details") else str(exc)
        if code in _AUTH_CODES:
            if self._trouble(code):
                logger.warning(
                    "smon: server %s refused this agent (%s: %s); check SMON_TOKEN. Retrying in "
                    "the background; training is unaffected",
                    self._config.server,
                    code,
                    details,
                )
        elif code in _POISON_CODES:
            dropped = self._drop_oldest_unacked()
            self._once(
                f"rpc:{code}",
                logging.WARNING,
                "smon: server %s rejected a batch (%s: %s); dropped it (%d records)",
                self._config.server,
                code,
                details,
                dropped,
            )
        elif self._trouble(code):
            cfg = self._config
            cause = hint(details or "", server=cfg.server, tls=cfg.tls, ca_file=cfg.tls_ca_file)
            logger.warning(
                "smon: cannot reach SMon server at %s (%s: %s)%s; retrying in the background, "
                "training is unaffected",
                cfg.server,
                code,
                details,
                f": {cause}" if cause else "",
            )
        else:
            logger.debug("smon: stream to %s ended: %s %s", self._config.server, code, details)

    def _drop_oldest_unacked(self) -> int:
        with self._lock:
            if not self._unacked:
                return 0
            seq = next(iter(self._unacked))
            _, n = self._unacked.pop(seq)
            self._in_doubt.discard(seq)
            self._dropped_undeliverable += n
            return n

    def _on_ack(self, ack: pb.Ack) -> None:
        with self._lock:
            if ack.step_tables:
                self._step_tables = True  # this server reads StepTables: send records so
            entry = self._unacked.pop(ack.seq, None)
            self._in_doubt.discard(ack.seq)
            if entry is not None:
                self.acked_batches += 1
            self.flush_seconds = ack.flush_seconds
            if ack.throttle_seconds > 0:
                self.throttled += 1
                hold = min(ack.throttle_seconds, MAX_THROTTLE_SECONDS)
                self._hold_until = max(self._hold_until, time.monotonic() + hold)
        for rejection in ack.rejections:
            self._once(
                f"rejected:{rejection.reason}",
                logging.WARNING,
                "smon: server rejected a %s record: %s (%s); not resending it",
                rejection.kind,
                rejection.reason,
                rejection.detail,
            )
        if ack.rejected and not ack.rejections:
            self._once(
                "rejected:unspecified",
                logging.WARNING,
                "smon: server rejected %d records of batch %d; not resending them",
                ack.rejected,
                ack.seq,
            )
        with self._progress:
            self._progress.notify_all()
        self._kick.set()

    # -- batching (runs on gRPC's request-consumer thread) -----------------------------------
    def _requests(self, session: _Session, stub: Any) -> Iterator[pb.Batch]:
        with self._lock:
            resend = list(self._unacked.items())
        for seq, (kept, _) in resend:
            if session.ended.is_set() or self._stop.is_set():
                return
            with self._lock:
                if seq not in self._unacked:
                    continue  # acked meanwhile
                self.resent_batches += 1
                session.sent.append(seq)
            yield kept

        cfg = self._config
        last_sent = last_records_sent = time.monotonic()
        while not (session.ended.is_set() or self._stop.is_set()):
            now = time.monotonic()
            batch: pb.Batch | None = None
            flush_interval, heartbeat_interval = flush_policy(cfg, self.flush_seconds)
            wait = heartbeat_interval - (now - last_sent)
            try:
                closing = self._closing.is_set()
                has_records = len(self._records) > 0
                held = not closing and now < self._hold_until
                window_open = len(self._unacked) < cfg.max_unacked_batches and not held
                records_due = (
                    has_records
                    and window_open
                    and (
                        closing
                        or len(self._records) >= self._batch_limit()
                        or now - last_records_sent >= flush_interval
                    )
                )
                if (
                    closing
                    and self._final_wanted
                    and not has_records
                    and not self._final_seq
                    and not self._cutting
                ):
                    batch = self._cut_batch(records=False, final=True)
                elif records_due or wait <= 0:
                    # A heartbeat that falls due takes the queued records along.
                    batch = self._cut_batch(records=window_open)
                    last_sent = now
                    if window_open:
                        last_records_sent = now
                elif has_records and window_open:
                    wait = min(wait, flush_interval - (now - last_records_sent))
                elif has_records and held:
                    wait = min(wait, self._hold_until - now)
                if now - self._clock_checked_at >= cfg.clock_refresh_interval:
                    self._refresh_clock(stub)
            except Exception as exc:
                self._errors.report("batching", exc)
            if batch is not None:
                self.sent_batches += 1
                with self._lock:
                    session.sent.append(batch.seq)
                yield batch
                continue
            self._kick.wait(max(0.001, wait))
            self._kick.clear()

    def _batch_limit(self) -> int:
        limit = self._config.max_batch_records
        if self.throttled and time.monotonic() - self._hold_until < THROTTLED_FOR_SECONDS:
            return limit * THROTTLED_BATCH_FACTOR
        return limit

    def _step_forms(self, steps: list[pb.StepRecord]) -> tuple[list[pb.StepRecord], pb.StepTable | None]:
        """Records as a StepTable once the server said it reads them (else, and for records a table
        cannot carry, as messages): a table costs the server a few array views instead of an
        object per record and span."""
        if not self._step_tables or not steps:
            return steps, None
        tabled: list[pb.StepRecord] = []
        rows: list[pb.StepRecord] = []
        for record in steps:
            (tabled if table.in_table(record) else rows).append(record)
        if not tabled:
            return steps, None
        try:
            return rows, table.to_table(tabled)
        except (OverflowError, ValueError) as exc:  # a value past its column's type: send messages
            self._errors.report("step_table", exc)
            return steps, None

    def _cut_batch(self, *, records: bool = True, final: bool = False) -> pb.Batch:
        """Take queued records into a new batch with the current heartbeat and counters."""
        steps: list[pb.StepRecord] = []
        samples: list[pb.GpuSample] = []
        with self._lock:
            self._cutting = records
        try:
            if records:
                for item in self._records.drain(self._batch_limit()):
                    (steps if isinstance(item, pb.StepRecord) else samples).append(item)
            try:
                heartbeat = self._heartbeat()
            except Exception as exc:
                self._errors.report("heartbeat", exc)
                heartbeat = pb.Heartbeat(time=time.time())
            rows, table = self._step_forms(steps)
            with self._lock:
                self._seq += 1
                batch = pb.Batch(
                    agent_id=self.agent_id,
                    seq=self._seq,
                    coords=self._coords,
                    steps=rows,
                    step_table=table,
                    gpu_samples=samples,
                    heartbeat=heartbeat,
                    counters=self.counters(),
                    clock_offset=self._clock_offset,
                    sent_time=time.time(),
                    final=final,
                )
                if steps or samples or final:  # kept until acked; heartbeat-only batches are not
                    self._unacked[self._seq] = (batch, len(steps) + len(samples))
                if final:
                    self._final_seq = self._seq
            return batch
        finally:
            with self._lock:
                self._cutting = False
