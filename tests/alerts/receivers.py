"""A real HTTP receiver on loopback that records what notifiers post (and can fail or stall)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str
    requests: list[tuple[str, Any]] = field(default_factory=list)  # (path, json body)
    statuses: list[int] = field(default_factory=list)  # answers to give, in order; then 200
    release: threading.Event = field(default_factory=threading.Event)  # cleared: requests stall
    stalled: int = 0
    failures: int = 0  # requests answered with an error status

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in list(self.requests) if p == path]

    def wait_for(self, path: str, count: int, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.bodies(path)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"{path}: {len(self.bodies(path))} of {count} requests after {timeout} s")


@contextmanager
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")
    state.release.set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"null")
            if not state.release.is_set():
                state.stalled += 1
                state.release.wait(60)
            status = state.statuses.pop(0) if state.statuses else 200
            if status < 300:
                state.requests.append((self.path, body))
            else:
                state.failures += 1
            # A sender that gave up waiting (a stalled receiver's test) has closed its socket.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"boom")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
