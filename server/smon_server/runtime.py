"""One server process: gRPC ingest, the HTTP API and the analysis loop on one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import uvicorn

from smon_server.alerts.sender import sender_loop
from smon_server.api.main import create_app
from smon_server.context import ServerContext
from smon_server.ingest.commits import GroupCommitter
from smon_server.ingest.limits import ActiveJobs, AgentRates
from smon_server.ingest.service import IngestService, make_grpc_server
from smon_server.ingest.validate import Limits
from smon_server.jobs.loop import analysis_loop
from smon_server.settings import Settings
from smon_server.store import migrate

log = logging.getLogger(__name__)


@dataclass
class Ports:
    http: int
    grpc: int


def _grpc_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if not (settings.tls_cert_file and settings.tls_key_file):
        return None
    pair = (settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())
    return grpc.ssl_server_credentials([pair])


async def serve(
    settings: Settings,
    *,
    on_ready: Callable[[ServerContext, Ports], None] | None = None,
    stop: asyncio.Event | None = None,
    freeze_heap: bool = False,
) -> None:
    """Run until `stop` is set or, in the main thread, until SIGINT / SIGTERM.

    `freeze_heap` (the `smon server` process): once up, the objects made while starting (modules,
    the app, SQLAlchemy's metadata; hundreds of thousands) are moved out of the cyclic garbage
    collector's view with `gc.freeze()`. Each full collection used to walk them all: a ~60 ms pause
    about once in a hundred API requests (`/jobs` max 88 ms against a 27 ms median; frozen: 37 ms).
    Tests run servers inside pytest's process, whose heap is not theirs to freeze."""
    context = ServerContext.from_settings(settings)
    if settings.auto_migrate:
        await asyncio.to_thread(migrate.upgrade, context.db)

    wake = asyncio.Event()
    running = asyncio.get_running_loop()

    def wake_loop() -> None:
        """wake.set from an API request's thread (a closed loop: the server is stopping)."""
        with contextlib.suppress(RuntimeError):
            running.call_soon_threadsafe(wake.set)

    context.wake_loop = wake_loop
    committer = GroupCommitter(
        context.db,
        max_group_records=settings.ingest_group_records,
        max_pending_records=settings.ingest_pending_records,
        stall_seconds=settings.stall_seconds,
        writers=settings.ingest_writers,
        linger_seconds=settings.ingest_linger_seconds,
    )
    committer.start()
    service = IngestService(
        committer,
        context.ingest_stats,
        on_final=wake.set,
        limits=Limits(
            max_batch_records=settings.max_batch_records,
            max_spans_per_step=settings.max_spans_per_step,
            max_duration_seconds=settings.max_duration_seconds,
        ),
        token=settings.ingest_token,
        rates=AgentRates(settings.ingest_agent_records_per_second),
        jobs=ActiveJobs(settings.ingest_max_jobs),
        batches_per_second=settings.ingest_batches_per_second,
    )
    context.ingest_load = service.load
    grpc_server = make_grpc_server(service, max_message_bytes=settings.max_message_bytes)
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    credentials = _grpc_credentials(settings)
    if credentials is not None:
        grpc_port = grpc_server.add_secure_port(address, credentials)
    else:
        grpc_port = grpc_server.add_insecure_port(address)
    await grpc_server.start()
    context.grpc_port = grpc_port

    config = uvicorn.Config(
        create_app(context),
        host=settings.http_host,
        port=settings.http_port,
        log_level="warning",
        ssl_certfile=str(settings.tls_cert_file) if settings.tls_cert_file else None,
        ssl_keyfile=str(settings.tls_key_file) if settings.tls_key_file else None,
    )
    http_server = uvicorn.Server(config)
    stop = stop or asyncio.Event()
    http_task = asyncio.create_task(http_server.serve())
    loop_task = asyncio.create_task(analysis_loop(context, stop, wake))
    sender_task = asyncio.create_task(sender_loop(context.db, context.notifiers, stop))
    try:
        while not http_server.started:
            if http_task.done():
                await http_task  # re-raises the start-up error (port in use, ...)
                return
            await asyncio.sleep(0.02)
        http_port = http_server.servers[0].sockets[0].getsockname()[1]
        log.info("SMon listening: HTTP %d, gRPC %d", http_port, grpc_port)
        if freeze_heap:
            gc.collect()
            gc.freeze()
        if on_ready is not None:
            on_ready(context, Ports(http=http_port, grpc=grpc_port))
        stop_task = asyncio.create_task(stop.wait())
        await asyncio.wait({http_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        http_server.should_exit = True
        with contextlib.suppress(Exception):
            await http_task
        await grpc_server.stop(grace=2.0)
        await asyncio.to_thread(committer.stop)
        for task in (loop_task, sender_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(context.close)


class BackgroundServer:
    """A server on its own thread and event loop (tests, `smon demo`); ports 0 pick free ones."""

    def __init__(self, settings: Settings, *, freeze_heap: bool = False) -> None:
        self.settings = settings
        self.freeze_heap = freeze_heap  # as `smon server` does (benchmarks); see serve()
        self.ports: Ports | None = None
        self.context: ServerContext | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="smon-server", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self.settings, on_ready=self._on_ready, stop=self._stop, freeze_heap=self.freeze_heap)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    def _on_ready(self, context: ServerContext, ports: Ports) -> None:
        self.context = context
        self.ports = ports
        self._ready.set()

    def start(self, timeout: float = 30.0, first_pass_timeout: float = 600.0) -> BackgroundServer:
        """Started once it serves (within `timeout`) and its analysis loop's first pass has ended
        (within `first_pass_timeout`: over a database that already holds jobs that pass analyses
        them): a caller that stores steps and runs passes itself (tests) would otherwise race
        that first pass, which on a loaded machine can start late and take a job's lease from
        under the caller's pass, and a benchmark would time requests beside it."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("SMon server did not start in time")
        if self.ports is None or self.context is None:
            raise RuntimeError(f"SMon server failed to start: {self._error!r}") from self._error
        if not self.context.first_pass_done.wait(first_pass_timeout):
            self.stop()
            raise TimeoutError(f"SMon server's first analysis pass took over {first_pass_timeout:g} s")
        return self

    @property
    def http_url(self) -> str:
        assert self.ports is not None
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def grpc_target(self) -> str:
        assert self.ports is not None
        return f"127.0.0.1:{self.ports.grpc}"

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
