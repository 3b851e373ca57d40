"""Framing between the training process and its shipper process (`smon.sidecar`).

Training process -> sidecar, on the sidecar's stdin: frames of a 1-byte type and a 4-byte
big-endian length, then the payload. `J` frames carry JSON control messages (the first one is the
configuration, the last one `{"close": ...}`), `B` frames a serialized `smon.v1.Batch` used as an
envelope for records, the latest heartbeat and the training side's counters.

Sidecar -> training process, on the sidecar's stdout: one JSON status object per line.

Writes use raw `os.write` on the file descriptor, never a buffered file: a process forked from
the training process (a DataLoader worker) must be able to close its copy without flushing half a
frame into the pipe.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

CONTROL = b"J"
ENVELOPE = b"B"
_HEADER = struct.Struct(">cI")
MAX_FRAME = 64 * 1024 * 1024


class WriteTimeout(OSError):
    """The reader did not take a frame in time; the stream may hold half a frame now."""


def write_frame(fd: int, kind: bytes, payload: bytes, timeout: float | None = None) -> None:
    """Write one whole frame. With `timeout`, `fd` must be non-blocking; raises WriteTimeout."""
    data = memoryview(_HEADER.pack(kind, len(payload)) + payload)
    deadline = None if timeout is None else time.monotonic() + timeout
    while data:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WriteTimeout(f"smon pipe: reader took no data for {timeout:.1f}s")
            _, writable, _ = select.select([], [fd], [], remaining)
            if not writable:
                continue
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            continue
        data = data[written:]


def write_control(fd: int, message: dict[str, Any], timeout: float | None = None) -> None:
    write_frame(fd, CONTROL, json.dumps(message).encode(), timeout)


def read_exact(fd: int, n: int) -> bytes | None:
    """Read exactly `n` bytes; None at end of file."""
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> tuple[bytes, bytes] | None:
    """(kind, payload) of the next frame; None at end of file."""
    header = read_exact(fd, _HEADER.size)
    if header is None:
        return None
    kind, length = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ValueError(f"smon pipe frame of {length} bytes")
    payload = read_exact(fd, length) if length else b""
    if payload is None:
        return None
    return kind, payload
