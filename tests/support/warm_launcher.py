"""The client of tests.support.forkrun's server: one launcher per test process that imports torch
once and forks every job's ranks from there (a forkrun command without its ~4 s of imports)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from tests.support.forkrun import STACKS_AFTER

FORKRUN = [sys.executable, "-m", "tests.support.forkrun"]
START_TIMEOUT = 120.0  # the server's imports, on a loaded 2-core machine
STACKS_BEFORE_TIMEOUT = 5.0  # seconds before a job's timeout its ranks write their stacks


class JobTimeout(Exception):
    """The job was still running at its timeout and has been killed; `stderr` is what it wrote."""

    def __init__(self, stdout: str, stderr: str) -> None:
        super().__init__("job timed out")
        self.stdout, self.stderr = stdout, stderr


class WarmLauncher:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="smon-forkrun-"))
        self.path = str(self.folder / "socket")
        self.log = self.folder / "server.log"
        with self.log.open("wb") as log:
            self.server = subprocess.Popen(
                [*FORKRUN, "--serve", self.path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(self.path):
            if self.server.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"forkrun server did not start: {self.log.read_text()[-4000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.server.poll() is None

    def run(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str, str]:
        """Run `forkrun ARGV` with this environment and the current directory: (status, stdout,
        stderr). Raises JobTimeout after killing the job's whole session."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            # Each rank writes its stacks to stderr shortly before the timeout (forkrun.STACKS_AFTER),
            # unless the timeout is so short that a healthy job could still be running then.
            if timeout > 2 * STACKS_BEFORE_TIMEOUT:
                env = {**env, STACKS_AFTER: str(timeout - STACKS_BEFORE_TIMEOUT)}
            request = json.dumps({"argv": list(argv), "env": dict(env), "cwd": os.getcwd()})
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(self.path)
                socket.send_fds(conn, [request.encode() + b"\n"], [out.fileno(), err.fileno()])
                conn.settimeout(timeout)
                reader = conn.makefile("rb")
                leader: int | None = None
                try:
                    leader = int(reader.readline())
                    line = reader.readline()
                except (TimeoutError, ValueError):
                    if leader is not None:
                        kill_session(leader)
                    raise JobTimeout(*read_both(out, err)) from None
            # No status line: the leader was killed (its status is its signal, as Popen's).
            status = int(line) if line.strip() else -signal.SIGKILL
            return (status, *read_both(out, err))

    def close(self) -> None:
        if self.server.poll() is None:
            kill_session(self.server.pid)
            self.server.wait()
        for path in (self.path, self.log):
            Path(path).unlink(missing_ok=True)
        self.folder.rmdir()


def kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def read_both(out: IO[bytes], err: IO[bytes]) -> tuple[str, str]:
    out.seek(0)
    err.seek(0)
    return out.read().decode(errors="replace"), err.read().decode(errors="replace")


_launcher: WarmLauncher | None = None


def warm_launcher() -> WarmLauncher:
    """This process's launcher, started on first use (again if it died), stopped at exit."""
    global _launcher
    if _launcher is None or not _launcher.alive():
        _launcher = WarmLauncher()
        atexit.register(_launcher.close)
    return _launcher
