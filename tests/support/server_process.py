"""`smon server` as its own process, for tests that kill it the way an OOM killer or a node
failure would (SIGKILL: no shutdown code runs)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx

_GIVEN: set[int] = set()


def free_port() -> int:
    """A port nothing listens on now, and one this process has not handed out before (two calls
    in a row may otherwise get the same one back from the kernel, and one server cannot bind it
    twice)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def start_server(
    database_url: str,
    http: int,
    grpc: int,
    env: dict[str, str] | None = None,
    *,
    log_path: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `smon server` on fixed ports and wait until /readyz answers."""
    smon = Path(sys.executable).parent / "smon"
    command = [str(smon), "server", "--db", database_url, "--http-port", str(http), "--grpc-port", str(grpc)]
    return start_command(command, http, {**os.environ, **(env or {})}, log_path=log_path)


def start_command(
    command: list[str],
    http: int,
    env: dict[str, str],
    cwd: Path | None = None,
    *,
    log_path: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start a server process (`command`, in exactly `env`) and wait until /readyz answers on
    `http`. Its output goes to a file that a failure to start quotes (a busy port, a migration
    that failed, a module missing from an install); to `log_path`, kept for the test to read,
    when given."""
    log: IO[bytes]
    if log_path is not None:
        log = open(log_path, "wb")  # noqa: SIM115
    else:
        log = tempfile.NamedTemporaryFile(prefix="smon-server-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"smon server exited ({process.returncode}) before it was ready:\n{_tail(log.name)}"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=2).status_code == 200:
                if log_path is None:
                    os.unlink(log.name)  # the server writes on to the unlinked file
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"smon server did not become ready within 90 s:\n{_tail(log.name)}")


def _tail(path: str, lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
