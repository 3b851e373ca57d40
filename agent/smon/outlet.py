"""Where the training process hands its records: a shipper process (default) or a local shipper.

Why a separate process: gRPC's C core is not fork-safe. A training process that holds gRPC
threads and then forks DataLoader workers (the default start method on Linux) crashes some of
those workers inside gRPC's own fork handlers (grpc/grpc#32758; reproduced here:
`ev_epoll1_linux.cc Check failed` and segfaults in `os.fork()`, in roughly one run in four of the
DataLoader tests). With `ProcessOutlet` the training process never imports gRPC: a small child
process (`python -m smon.sidecar`) owns the connection, and the two talk over a pipe. As a bonus,
batching, compression and the network run outside the training process's GIL, and the sidecar
keeps heartbeating (with the last heartbeat it got) if the training process wedges.

`LocalOutlet` runs the same `Shipper` in this process: it is what the sidecar itself uses, and the
fallback when a process cannot be started (or `SMON_AGENT_SHIPPER=thread`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Protocol

from smon.config import AgentConfig
from smon.errors import ErrorCounter
from smon.pipe_protocol import ENVELOPE, WriteTimeout, write_control, write_frame
from smon.v1 import ingest_pb2 as pb

logger = logging.getLogger("smon")


class Outlet(Protocol):
    """What the feeder hands envelopes to."""

    agent_id: str

    def send(self, envelope: pb.Batch) -> None: ...

    def close(self, timeout: float, *, final: bool) -> bool: ...

    def status(self) -> dict[str, Any]: ...

    def detach_in_fork_child(self) -> None: ...


class LocalOutlet:
    """Ships from this process with a `Shipper` (gRPC imported here, lazily)."""

    def __init__(
        self,
        config: AgentConfig,
        coords: pb.Coordinates,
        errors: ErrorCounter,
        *,
        agent_id: str | None = None,
        relay: str | None = None,
    ) -> None:
        from smon.record_queue import RecordQueue
        from smon.shipper import Shipper

        self.agent_id = agent_id or uuid.uuid4().hex
        self._errors = errors
        self._heartbeat = pb.Heartbeat(last_step=-1)
        self._upstream = pb.AgentCounters()
        self._records = RecordQueue(
            config.queue_size, threshold=config.max_batch_records, on_threshold=self._kick
        )
        self.shipper = Shipper(
            config,
            self._records,
            coords,
            self._latest_heartbeat,
            errors,
            agent_id=self.agent_id,
            upstream=self._upstream_counters,
            relay=relay,
        )
        self.shipper.start()

    def _kick(self) -> None:
        self.shipper.kick()

    def _latest_heartbeat(self) -> pb.Heartbeat:
        return self._heartbeat

    def _upstream_counters(self) -> pb.AgentCounters:
        return self._upstream

    def send(self, envelope: pb.Batch) -> None:
        for step in envelope.steps:
            self._records.put(step)
        for sample in envelope.gpu_samples:
            self._records.put(sample)
        if envelope.HasField("heartbeat"):
            self._heartbeat = envelope.heartbeat
        if envelope.HasField("counters"):
            self._upstream = envelope.counters
        if envelope.coords.gpu_uuid:
            self.shipper.set_gpu_uuid(envelope.coords.gpu_uuid)

    def close(self, timeout: float, *, final: bool) -> bool:
        return self.shipper.close(timeout, final=final)

    def status(self) -> dict[str, Any]:
        """This outlet's own numbers (the training side adds its own drops / errors / queue)."""
        s = self.shipper
        return {
            "sent": s.sent_batches,
            "acked": s.acked_batches,
            "resent": s.resent_batches,
            "dropped": s.local_dropped(),
            "unconfirmed": s.unconfirmed_records,
            "errors": self._errors.count,
            "queued": s.local_queued(),
            "connected": s.connected,
            "via_relay": s.via_relay,
        }

    def detach_in_fork_child(self) -> None:
        pass  # gRPC in a forked child is beyond saving; the child simply never uses it


class ProcessOutlet:
    """Hands envelopes to a `python -m smon.sidecar` child over its stdin.

    Writes never wait longer than `send_timeout`: a sidecar that stops reading (stopped, wedged)
    is killed rather than allowed to block the feeder, or close(), indefinitely.
    """

    send_timeout = 5.0

    def __init__(self, config: AgentConfig, coords: pb.Coordinates) -> None:
        self.agent_id = uuid.uuid4().hex
        self._config = config
        self._lock = threading.Lock()  # one writer at a time on the pipe
        self._status: dict[str, Any] = {}
        self._status_buffer = b""
        self._closed = False
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        # gRPC's C core prints a line of its own per failed attempt (`Handshake failed`, 56-59
        # lines per rank in 7.5 s of a TLS mismatch) into the training job's stderr; the shipper
        # says what matters once per episode. SMON_GRPC_VERBOSITY brings the core's lines back.
        env["GRPC_VERBOSITY"] = os.environ.get("SMON_GRPC_VERBOSITY", "").strip() or "NONE"
        self._process = subprocess.Popen(
            [sys.executable, "-P", "-m", "smon.sidecar"],  # -P: the cwd cannot shadow modules
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=env,
            close_fds=True,
            start_new_session=False,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._write_fd = self._process.stdin.fileno()
        self._read_fd = self._process.stdout.fileno()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._write_control(
            {
                "config": dataclasses.asdict(config),
                "agent_id": self.agent_id,
                "coords": coords.SerializeToString().hex(),
                "parent_pid": os.getpid(),
            }
        )

    def _write_control(self, message: dict[str, Any]) -> None:
        try:
            write_control(self._write_fd, message, self.send_timeout)
        except WriteTimeout:
            self._kill()
            raise

    def _kill(self) -> None:
        self._closed = True
        with contextlib.suppress(Exception):
            self._process.kill()

    def send(self, envelope: pb.Batch) -> None:
        with self._lock:
            if self._closed:
                raise BrokenPipeError("smon shipper process is closed")
            try:
                write_frame(self._write_fd, ENVELOPE, envelope.SerializeToString(), self.send_timeout)
            except WriteTimeout:
                self._kill()  # half a frame may be in the pipe: this stream is unusable
                raise

    def close(self, timeout: float, *, final: bool) -> bool:
        """Ask the sidecar to flush (for at most `timeout`) and wait that long for it to finish."""
        deadline = time.monotonic() + max(0.0, timeout) + 1.0  # + its own start-up and exit
        with self._lock:
            if self._closed:
                return bool(self._status.get("delivered", False))
            self._closed = True
            with contextlib.suppress(OSError):
                self._write_control({"close": {"timeout": timeout, "final": final}})
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # type: ignore[union-attr]
        while self._process.poll() is None and time.monotonic() < deadline:
            self._read_status()
            time.sleep(0.01)
        self._read_status()
        if self._process.poll() is None:
            logger.info("smon: shipper process still flushing after %.1fs; leaving it to finish", timeout)
            return False
        with contextlib.suppress(OSError):
            self._process.stdout.close()  # type: ignore[union-attr]
        return bool(self._status.get("delivered", False))

    @property
    def pid(self) -> int:
        """The shipper process's pid (for tools that account for its CPU)."""
        return int(self._process.pid)

    def status(self) -> dict[str, Any]:
        self._read_status()
        return dict(self._status)

    def _read_status(self) -> None:
        """Take the newest complete status line the sidecar has written (never blocks)."""
        if self._read_fd < 0:
            return
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                return
            if not chunk:
                break
            self._status_buffer += chunk
        if b"\n" not in self._status_buffer:
            return
        lines = self._status_buffer.split(b"\n")
        self._status_buffer = lines[-1]
        for line in reversed(lines[:-1]):
            if line.strip():
                with contextlib.suppress(ValueError):
                    self._status = json.loads(line)
                    return

    def detach_in_fork_child(self) -> None:
        """In a forked child: close our copies of the pipes so the sidecar still sees end-of-file
        when the training process goes away, even while workers live on. Frames are only ever
        written with os.write, so the file objects' buffers are empty and closing flushes nothing."""
        self._closed = True
        self._read_fd = -1
        for stream in (self._process.stdin, self._process.stdout):
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[union-attr]


def start_outlet(config: AgentConfig, coords: pb.Coordinates) -> Outlet:
    """The sidecar unless told otherwise or it cannot start; then a local shipper thread."""
    mode = os.environ.get("SMON_AGENT_SHIPPER", "process").strip().lower() or "process"
    if mode != "thread":
        try:
            return ProcessOutlet(config, coords)
        except Exception as exc:
            logger.warning(
                "smon: could not start the shipper process (%r); shipping from a thread in "
                "this process instead (gRPC in a process that forks DataLoader workers is "
                "not fork-safe: set GRPC_ENABLE_FORK_SUPPORT=0 before importing grpc)",
                exc,
            )
    return LocalOutlet(config, coords, ErrorCounter())  # its own count: the trainer's travels upstream
