"""The shipper process, `python -m smon.sidecar`: started by the agent of one training rank.

It reads the configuration and then record envelopes from its stdin (see pipe_protocol.py),
ships them with a `LocalOutlet` (the gRPC `Shipper`), and writes its status to stdout once
every 0.2 s. It ends when the training process asks it to close (then its last batch is marked
`final`), or when its stdin reaches end-of-file / the training process is gone (not final: the
training process died); either way it first flushes for at most the flush timeout.

It ignores SIGINT (Ctrl-C reaches the whole process group; the training process decides when
shipping stops) and runs at a lower CPU priority than training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
import threading
from typing import Any

from smon.config import AgentConfig
from smon.errors import ErrorCounter
from smon.outlet import LocalOutlet
from smon.pipe_protocol import CONTROL, ENVELOPE, read_frame
from smon.relay import Relay, relay_address
from smon.v1 import ingest_pb2 as pb

logger = logging.getLogger("smon")

STATUS_INTERVAL = 0.2


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


class _StatusWriter:
    """Periodic JSON status lines on stdout."""

    def __init__(self, outlet: LocalOutlet) -> None:
        self._outlet = outlet
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smon-status", daemon=True)
        self._thread.start()

    def write(self, **extra: Any) -> None:
        line = json.dumps({**self._outlet.status(), **extra}) + "\n"
        with self._lock, contextlib.suppress(OSError):
            os.write(1, line.encode())

    def _run(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL):
            self.write()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    with contextlib.suppress(OSError):
        os.nice(10)
    first = read_frame(0)
    if first is None or first[0] != CONTROL:
        return 2
    spec = json.loads(first[1])
    config = AgentConfig(**spec["config"])
    coords = pb.Coordinates.FromString(bytes.fromhex(spec["coords"]))
    parent_pid = int(spec.get("parent_pid", os.getppid()))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(message)s [smon shipper, rank {coords.rank}]"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("SMON_LOG_LEVEL", "WARNING").upper())
    logger.propagate = False

    errors = ErrorCounter()
    relay, target = _start_relay(config, coords, errors)
    outlet = LocalOutlet(config, coords, errors, agent_id=spec["agent_id"], relay=target)
    status = _StatusWriter(outlet)
    close_request: dict[str, Any] | None = None
    try:
        while True:
            readable, _, _ = select.select([0], [], [], 1.0)
            if not readable:
                if os.getppid() != parent_pid:
                    break  # the training process is gone without closing its end
                continue
            frame = read_frame(0)
            if frame is None:
                break
            kind, payload = frame
            if kind == ENVELOPE:
                try:
                    outlet.send(pb.Batch.FromString(payload))
                except Exception as exc:
                    errors.report("sidecar_envelope", exc)
            elif kind == CONTROL:
                message = json.loads(payload)
                if "close" in message:
                    close_request = message["close"]
                    break
    except _Terminated:
        pass
    except Exception as exc:
        errors.report("sidecar", exc)
    timeout = float(close_request["timeout"]) if close_request else config.flush_timeout
    final = bool(close_request and close_request.get("final", True))
    delivered = False
    with contextlib.suppress(_Terminated):
        delivered = outlet.close(timeout, final=final)
    if relay is not None:
        with contextlib.suppress(_Terminated):
            relay.close(timeout)  # the host's other ranks are closing too: their last batches
    status.stop()
    status.write(done=True, delivered=delivered)
    return 0


def _start_relay(
    config: AgentConfig, coords: pb.Coordinates, errors: ErrorCounter
) -> tuple[Relay | None, str | None]:
    """With the relay on (smon/relay.py): LOCAL_RANK 0 runs the host's relay, and every rank ships
    to it. A relay that cannot start leaves its rank direct (the others go direct when it does not
    answer)."""
    if not config.relay:
        return None, None
    address = relay_address(coords.job, coords.host, config.server)
    if coords.local_rank != 0:
        return None, address
    try:
        relay = Relay(config, address, errors)
        relay.start()
    except Exception as exc:
        errors.report("relay", exc)
        return None, None
    return relay, address


def run() -> None:
    """Run, then leave without interpreter finalisation. At exit, garbage collection of gRPC call
    objects (`_Rendezvous.__del__`) can wait forever on a lock that a thread ended while holding:
    seen here as a sidecar hung after its job finished, holding the job's stderr open so the
    launcher (torchrun, a scheduler) waited for it too. Everything this process owes is written
    and acked by the time main() returns, so a hard exit loses nothing."""
    code = 1
    try:
        code = main()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    run()
