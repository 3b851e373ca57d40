"""A TCP proxy in its own process, for tests that put a fault between the server and its database:
kill it (connections cut, new ones refused), or stop it with SIGSTOP (a database that hangs: the
kernel still accepts connections and data, nobody answers). Standard library only, so it starts
in a few tens of milliseconds: `python tests/support/tcp_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen_port: int, host: str, port: int) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))

    server = await asyncio.start_server(client, "127.0.0.1", listen_port, reuse_address=True)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


class Proxy:
    """The proxy process, seen from a test: start, kill (cut), stop / resume (hang)."""

    def __init__(self, listen_port: int, host: str, port: int) -> None:
        self.listen_port, self.host, self.port = listen_port, host, port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Proxy:
        command = [sys.executable, str(Path(__file__)), str(self.listen_port), self.host, str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        deadline = time.monotonic() + 10
        while self.process.stdout.readline().strip() != b"listening":
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the TCP proxy on port {self.listen_port} did not start")
        return self

    def kill(self) -> None:
        """Cut every connection through it; new ones are refused until start()."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def hang(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
        self.kill()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
