"""A real gRPC Ingest server for agent tests: records every batch it receives and acks it.

Knobs let a test make it misbehave the ways a real server or network can: drop the stream before
acking, never ack, reject records, require a token, report a skewed clock.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc


class BatchLog:
    """Reading what arrived; subclasses provide `snapshot()`."""

    def snapshot(self) -> list[pb.Batch]:
        raise NotImplementedError

    def steps(self) -> list[pb.StepRecord]:
        return [s for b in self.snapshot() for s in b.steps]

    def step_numbers(self) -> list[int]:
        """Steps that arrived, as messages or in StepTables."""
        tabled = [n for b in self.snapshot() for n in array("q", b.step_table.step)]
        return sorted({s.step for s in self.steps()} | set(tabled))

    def wait_for(self, predicate: Callable[[BatchLog], bool], timeout: float = 5.0) -> bool:
        """Poll `predicate` until it holds or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True


class RecordingIngest(BatchLog, pb_grpc.IngestServicer):
    def __init__(self, *, clock_offset: float = 0.0, token: str | None = None) -> None:
        self.clock_offset = clock_offset
        self.token = token
        self.batches: list[pb.Batch] = []
        self.metadata: list[dict[str, str]] = []
        self.drop_streams_on_records = 0  # abort the stream (no ack) on the next N record batches
        self.abort_code = grpc.StatusCode.UNAVAILABLE  # ... with this status
        self.verdict_on_drop = False  # ... saying, as SMon's server does, that nothing unacked was stored
        self.hold_clock_after_drop = False  # then Clock answers no more: the next stream never opens
        self._clock_held = threading.Event()
        self.ack = True
        self.rejection: pb.Rejection | None = None
        self.clock_calls = 0
        self.throttle_next = 0.0  # the next record batch's Ack asks the agent to hold back this long
        self.step_tables = False  # Acks say this server reads StepTables
        self.received_at: list[float] = []  # time.monotonic() of each batch, as `batches`
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    # -- RPCs -------------------------------------------------------------------------------------
    def Stream(self, request_iterator: Iterator[pb.Batch], context: Any) -> Iterator[pb.Ack]:
        md = {k: v for k, v in context.invocation_metadata()}
        with self._lock:
            self.metadata.append(md)
        if self.token is not None and md.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        for batch in request_iterator:
            with self._changed:
                self.batches.append(batch)
                self.received_at.append(time.monotonic())
                self._changed.notify_all()
                drop = False
                if self.drop_streams_on_records and (batch.steps or batch.gpu_samples):
                    self.drop_streams_on_records -= 1
                    drop = True
            if drop:
                if self.verdict_on_drop:
                    context.set_trailing_metadata((("smon-unacked-not-stored", "1"),))
                if self.hold_clock_after_drop:
                    self._clock_held.set()
                context.abort(self.abort_code, "test: stream dropped before ack")
            if not self.ack:
                continue
            ack = pb.Ack(
                agent_id=batch.agent_id,
                seq=batch.seq,
                accepted=len(batch.steps) + batch.step_table.records + len(batch.gpu_samples),
                step_tables=self.step_tables,
            )
            if self.throttle_next and (batch.steps or batch.gpu_samples):
                ack.throttle_seconds, self.throttle_next = self.throttle_next, 0.0
            if self.rejection is not None and batch.steps:
                ack.rejected = 1
                ack.accepted -= 1
                ack.rejections.append(self.rejection)
            yield ack

    def Clock(self, request: pb.ClockRequest, context: Any) -> pb.ClockReply:
        if self._clock_held.is_set():
            time.sleep(0.5)
            context.abort(grpc.StatusCode.UNAVAILABLE, "test: clock held")
        with self._lock:
            self.clock_calls += 1
        return pb.ClockReply(agent_time=request.agent_time, server_time=time.time() + self.clock_offset)

    # -- reading what arrived ---------------------------------------------------------------------
    def snapshot(self) -> list[pb.Batch]:
        with self._lock:
            return list(self.batches)

    def wait_for(self, predicate: Callable[[BatchLog], bool], timeout: float = 5.0) -> bool:
        """Poll `predicate` (woken by each arriving batch) until it holds or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._changed:
                self._changed.wait(min(remaining, 0.05))
        return True


class IngestServer:
    """A grpc.server on 127.0.0.1 running a RecordingIngest; restartable on the same port."""

    def __init__(
        self, servicer: RecordingIngest, port: int = 0, *, options: list[tuple[str, int]] | None = None
    ) -> None:
        self.servicer = servicer
        self.port = port
        self.options = options or []
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> IngestServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=self.options)
        pb_grpc.add_IngestServicer_to_server(self.servicer, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
