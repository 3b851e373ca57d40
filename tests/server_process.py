"""`smon server` as its own process, for tests that kill it the way an OOM killer or a node
failure would (SIGKILL: no shutdown code runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    database_url: str, http: int, grpc: int, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `smon server` on fixed ports and wait until /readyz answers."""
    smon = Path(sys.executable).parent / "smon"
    process = subprocess.Popen(
        [str(smon), "server", "--db", database_url, "--http-port", str(http), "--grpc-port", str(grpc)],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError("smon server did not become ready")
