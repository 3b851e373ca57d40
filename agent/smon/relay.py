"""One stream per host: the shipper of LOCAL_RANK 0 relays the batches of its host's ranks.

Why: the server pays a fixed cost per message (~600-760 µs of one GIL-bound core per batch,
docs/storage.md), whatever it holds; 16,384 ranks each flushing once a second cannot fit one
replica. A relay turns a host's N small batches a flush into one `HostBatch` on one
`Ingest.StreamHost` stream (docs/agent.md "Host relay").

How: the sidecar of LOCAL_RANK 0 (smon/sidecar.py) runs a `Relay`, a small gRPC server on a Unix
socket whose path comes from the job, host and server (`relay_address`). Every sidecar of the
host, its own included, ships to that socket with the ordinary `Ingest.Stream` protocol, so a
rank's Shipper keeps its batches, seqs, resends and accounting unchanged. The relay bundles what
arrived (each flush interval, or as soon as every connected rank has sent something), forwards
the bytes unparsed as the parts of one HostBatch, and routes each part's Ack back to the stream
that sent it once the server has committed it. `Clock` is answered from the relay's own estimate
of the server's clock: the ranks of a host share its clock.

Failures: the server lacks StreamHost (an older server) -> the relay refuses every rank with
FAILED_PRECONDITION and `RELAY_REFUSED`, and the ranks go direct at once. The server is away ->
the relay ends its ranks' streams with UNAVAILABLE and `RELAY_UPSTREAM` (a rank then retries the
relay, as it would retry the server). The relay is gone (its process killed) -> a rank's Shipper
goes direct after `AgentConfig.relay_fallback` seconds without reaching it (smon/shipper.py).
Either way a rank resends its unacked batches unchanged, and the server stores a resent
(agent_id, seq) once, so nothing acked is lost and nothing is stored twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from smon.clock_offset import estimate_offset
from smon.config import AgentConfig, env_int
from smon.errors import ErrorCounter
from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc

logger = logging.getLogger("smon")

# Details that start a relay's refusals: the Shipper tells them from a relay that is not there.
RELAY_REFUSED = "smon relay refused:"  # FAILED_PRECONDITION: ship directly
RELAY_UPSTREAM = "smon relay upstream:"  # UNAVAILABLE: the relay is up, the server is not
# HostBatches on the upstream stream awaiting their HostAck (the server reads 8 ahead).
MAX_IN_FLIGHT = 8
# Bytes of parts per HostBatch (the server's default receive limit is far above it).
MAX_HOST_BATCH_BYTES = 2 * 1024 * 1024
_POLL = 0.2
# A rank's final batch carries no records (smon/shipper.py), so it is small: only parts this small
# are parsed to find it, and a final part leaves at once instead of waiting for the others' turn
# (a job's end would otherwise wait one flush interval for ranks that have already gone).
_FINAL_PEEK_BYTES = 4096


def relay_address(job: str, host: str, server: str) -> str:
    """The Unix socket of this host's relay for this job and server (short: sun_path is 108 B)."""
    digest = hashlib.sha256(f"{job}\0{host}\0{server}".encode()).hexdigest()[:20]
    return f"unix:{os.path.join(tempfile.gettempdir(), f'smon-relay-{digest}.sock')}"


@dataclass(eq=False)
class _Member:
    """One rank's stream to the relay."""

    acks: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    in_flight: int = 0  # parts forwarded and not yet answered
    reading: bool = True


@dataclass(frozen=True)
class _End:
    code: grpc.StatusCode
    details: str
    unstored: bool = False  # nothing this member left unacked was stored


class Relay:
    """The host's relay: a Unix-socket Ingest server for the host's ranks, one stream upstream."""

    def __init__(self, config: AgentConfig, address: str, errors: ErrorCounter) -> None:
        from smon.shipper import open_channel  # the Shipper imports this module

        self._open_channel = open_channel
        self._config = config
        self.address = address
        self._errors = errors
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {config.token}"),) if config.token else ()
        )
        self._lock = threading.Lock()
        self._members: set[_Member] = set()
        self._pending: list[tuple[_Member, bytes]] = []
        self._urgent = False  # a final part is pending: bundle now
        self._in_flight: dict[int, list[_Member]] = {}  # HostBatch seq -> the members of its parts
        self._seq = 0
        self._refused: str | None = None  # why the ranks must ship directly (then for good)
        self._offset: float | None = None  # server clock - this host's clock
        self._flush_seconds = 0.0
        self._hold_until = 0.0
        self._in_trouble = False  # the upstream failed since it last had a HostAck (said once)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._call: Any = None
        self.host_batches = 0  # HostBatches forwarded (a test reads them)
        self.parts = 0
        path = address.removeprefix("unix:")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous attempt's relay of this job, gone without cleaning up
        # A thread per rank's stream for as long as it lasts, and some for Clock calls.
        ranks = env_int("LOCAL_WORLD_SIZE") or 8
        pool = futures.ThreadPoolExecutor(max_workers=2 * ranks + 16, thread_name_prefix="smon-relay")
        self._server = grpc.server(pool, maximum_concurrent_rpcs=None)
        self._server.add_generic_rpc_handlers((self._handler(),))
        if not self._server.add_insecure_port(address):
            raise OSError(f"cannot listen on {address}")
        self._path = path
        self._upstream = threading.Thread(target=self._run_upstream, name="smon-relay-up", daemon=True)

    def start(self) -> None:
        self._server.start()
        with contextlib.suppress(OSError):
            os.chmod(self._path, 0o600)  # the job's user only
        self._upstream.start()

    @property
    def members(self) -> int:
        with self._lock:
            return len(self._members)

    def close(self, timeout: float) -> None:
        """Relay for at most `timeout` more seconds while ranks are still connected (they are closing
        too, their last batches on the way), then stop; a rank still connected then goes direct."""
        deadline = time.monotonic() + max(0.0, timeout)
        while time.monotonic() < deadline:
            with self._lock:
                if not self._members and not self._pending and not self._in_flight:
                    break
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        self._end_all(_End(grpc.StatusCode.UNAVAILABLE, f"{RELAY_UPSTREAM} the relay is closing"))
        self._server.stop(0.5)
        with contextlib.suppress(OSError):
            os.unlink(self._path)

    # -- the ranks' side ------------------------------------------------------------------------
    def _handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "smon.v1.Ingest",
            {
                "Stream": grpc.stream_stream_rpc_method_handler(
                    self._member_stream, response_serializer=pb.Ack.SerializeToString
                ),
                "Clock": grpc.unary_unary_rpc_method_handler(
                    self._clock,
                    request_deserializer=pb.ClockRequest.FromString,
                    response_serializer=pb.ClockReply.SerializeToString,
                ),
            },
        )

    def _clock(self, request: pb.ClockRequest, context: Any) -> pb.ClockReply:
        if self._refused is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{RELAY_REFUSED} {self._refused}")
        if self._offset is None:
            context.abort(
                grpc.StatusCode.UNAVAILABLE, f"{RELAY_UPSTREAM} no clock estimate from the server yet"
            )
        return pb.ClockReply(agent_time=request.agent_time, server_time=time.time() + (self._offset or 0.0))

    def _member_stream(self, requests: Iterator[bytes], context: Any) -> Iterator[pb.Ack]:
        if self._refused is not None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{RELAY_REFUSED} {self._refused}")
        member = _Member()
        with self._lock:
            self._members.add(member)

        def read() -> None:
            try:
                for raw in requests:
                    final = len(raw) <= _FINAL_PEEK_BYTES and _is_final(raw)
                    with self._lock:
                        if member not in self._members:
                            return
                        self._pending.append((member, raw))
                        self._urgent = self._urgent or final
                        everyone = len({m for m, _ in self._pending}) >= len(self._members)
                    if everyone or final:
                        self._wake.set()
            except Exception:  # the rank's stream ended (cancelled, cut): the loop below sees it
                pass
            finally:
                member.acks.put(None)

        threading.Thread(target=read, name="smon-relay-rank", daemon=True).start()
        try:
            while context.is_active():
                try:
                    item = member.acks.get(timeout=_POLL)
                except queue.Empty:
                    continue
                if item is None:
                    member.reading = False
                elif isinstance(item, _End):
                    if item.unstored:
                        context.set_trailing_metadata((("smon-unacked-not-stored", "1"),))
                    context.abort(item.code, item.details)
                else:
                    yield item
                with self._lock:
                    if not member.reading and member.in_flight == 0:
                        return  # the rank half-closed and every part it sent is answered
        finally:
            with self._lock:
                self._members.discard(member)
                self._pending = [(m, raw) for m, raw in self._pending if m is not member]

    def _end_all(self, end: _End) -> None:
        with self._lock:
            members = list(self._members)
            self._members.clear()
            self._pending.clear()
            self._urgent = False
            self._in_flight.clear()
        for member in members:
            member.acks.put(end)

    # -- upstream -------------------------------------------------------------------------------
    def _run_upstream(self) -> None:
        from smon.shipper import backoff_delay

        failures = 0
        while not self._stop.is_set() and self._refused is None:
            try:
                acked = self._session()
            except Exception as exc:  # a bug of ours: count it, keep going
                self._errors.report("relay", exc)
                acked = False
            failures = 0 if acked else failures + 1
            self._stop.wait(backoff_delay(failures, self._config.backoff_base, self._config.backoff_cap))

    def _session(self) -> bool:
        ended = threading.Event()
        channel = self._open_channel(self._config)
        acked = False
        try:
            stub = pb_grpc.IngestStub(channel)
            self._offset = estimate_offset(
                stub,
                samples=self._config.clock_samples,
                timeout=self._config.rpc_timeout,
                metadata=self._metadata,
            ).offset
            call = stub.StreamHost(self._bundles(ended), metadata=self._metadata)
            with self._lock:
                self._call = call
            for host_ack in call:
                if not acked and self._in_trouble:
                    self._in_trouble = False
                    logger.info("smon: this host's relay reached %s again", self._config.server)
                acked = True
                self._on_host_ack(host_ack)
            self._end_all(_End(grpc.StatusCode.UNAVAILABLE, f"{RELAY_UPSTREAM} stream ended"))
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self._refused = f"the server at {self._config.server} has no StreamHost"
                logger.info("smon: %s; this host's ranks ship directly", self._refused)
                self._end_all(_End(grpc.StatusCode.FAILED_PRECONDITION, f"{RELAY_REFUSED} {self._refused}"))
            elif not self._stop.is_set():
                from smon.shipper import says_unstored

                details = exc.details() if hasattr(exc, "details") else str(exc)
                if not self._in_trouble:  # the ranks say nothing of the relay's troubles: it does
                    self._in_trouble = True
                    logger.warning(
                        "smon: this host's relay cannot reach SMon server at %s (%s: %s); retrying in "
                        "the background, training is unaffected",
                        self._config.server,
                        code,
                        details,
                    )
                self._end_all(
                    _End(
                        grpc.StatusCode.UNAVAILABLE, f"{RELAY_UPSTREAM} {code}: {details}", says_unstored(exc)
                    )
                )
        finally:
            ended.set()
            self._wake.set()
            with self._lock:
                self._call = None
            channel.close()
        return acked

    def _bundles(self, ended: threading.Event) -> Iterator[pb.HostBatch]:
        """The upstream requests: what the ranks sent, one HostBatch each flush interval (sooner
        when every connected rank has sent something), held while the server asks to throttle."""
        last = time.monotonic()
        while not (ended.is_set() or self._stop.is_set()):
            now = time.monotonic()
            interval = max(self._config.flush_interval, min(self._flush_seconds, 10.0))
            bundle: pb.HostBatch | None = None
            with self._lock:
                everyone = len({m for m, _ in self._pending}) >= max(1, len(self._members))
                if (
                    self._pending
                    and len(self._in_flight) < MAX_IN_FLIGHT
                    and now >= self._hold_until
                    and (everyone or self._urgent or now - last >= interval)
                ):
                    taken, size = 0, 0
                    while taken < len(self._pending) and (
                        taken == 0 or size + len(self._pending[taken][1]) <= MAX_HOST_BATCH_BYTES
                    ):
                        size += len(self._pending[taken][1])
                        taken += 1
                    parts, self._pending = self._pending[:taken], self._pending[taken:]
                    self._urgent = self._urgent and bool(self._pending)
                    self._seq += 1
                    self._in_flight[self._seq] = [m for m, _ in parts]
                    for member, _ in parts:
                        member.in_flight += 1
                    bundle = pb.HostBatch(seq=self._seq, parts=[raw for _, raw in parts])
                    self.host_batches += 1
                    self.parts += len(parts)
            if bundle is not None:
                last = now
                yield bundle
                continue
            self._wake.wait(max(0.005, min(interval - (now - last), self._hold_until - now, _POLL)))
            self._wake.clear()

    def _on_host_ack(self, host_ack: pb.HostAck) -> None:
        self._flush_seconds = host_ack.flush_seconds
        if host_ack.throttle_seconds > 0:
            hold = min(host_ack.throttle_seconds, 10.0)
            self._hold_until = max(self._hold_until, time.monotonic() + hold)
        with self._lock:
            members = self._in_flight.pop(host_ack.seq, None) if host_ack.seq else None
            if members is None:
                return
            # Under the lock: a rank's stream must not see its count at 0 before its Ack is queued.
            for member, ack in zip(members, host_ack.acks, strict=False):
                if member in self._members:
                    member.acks.put(ack)
            for member in members:
                member.in_flight -= 1
        self._wake.set()


def _is_final(raw: bytes) -> bool:
    """Whether a rank's serialized batch is its last (a part that does not parse is not)."""
    try:
        return pb.Batch.FromString(raw).final
    except Exception:  # the server judges malformed parts; the relay only forwards them
        return False
