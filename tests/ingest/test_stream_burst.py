"""A fleet that opens thousands of streams at once gets every one taken up (issue 30).

grpc.aio's server asks its core for one new call at a time from its event loop; while that loop
is busy, new streams wait in the core's pending queue, which by default refuses some past 1,000
and all past 3,000 (RESOURCE_EXHAUSTED; a client still writing reads "Internal error from Core").
At 8,000 simulated agents that refused 1,828 streams at the start (docs/storage.md). The server
that `make_grpc_server` builds must take them all up once its loop is free again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import cast

import grpc

from smon_server.ingest.service import IngestService, make_grpc_server

STREAMS = 2_000  # the default queue refuses about a quarter of those past its first 1,000
PER_CHANNEL = 50


class _Echo:
    """Stands in for IngestService: a stream that answers each request with itself."""

    def handler(self) -> grpc.GenericRpcHandler:
        async def echo(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            async for request in requests:
                yield request

        return grpc.method_handlers_generic_handler(
            "smon.v1.Ingest", {"Stream": grpc.stream_stream_rpc_method_handler(echo)}
        )


class _ServerThread(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.stopped: asyncio.Event | None = None

    def run(self) -> None:
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        server = make_grpc_server(cast(IngestService, _Echo()), max_message_bytes=1 << 20)
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self.stopped = asyncio.Event()
        self.ready.set()
        await self.stopped.wait()
        await server.stop(0)

    def stop(self) -> None:
        assert self.stopped is not None
        self.loop.call_soon_threadsafe(self.stopped.set)
        self.join(10)


async def _burst(target: str, all_written: threading.Event) -> tuple[int, list[str]]:
    """Opens STREAMS streams, writes one message on each, then reads each one's answer."""
    channels = [grpc.aio.insecure_channel(target) for _ in range(STREAMS // PER_CHANNEL)]
    try:
        calls, failures = [], []
        for i in range(STREAMS):
            call = channels[i // PER_CHANNEL].stream_stream("/smon.v1.Ingest/Stream")()
            try:
                await call.write(b"%d" % i)
            except grpc.RpcError as exc:  # refused already: grpc reports the failed write
                failures.append(f"stream {i} on writing: {exc.code()} {exc.details()}")
                continue
            calls.append((call, i))
        all_written.set()

        async def answer(call: grpc.aio.StreamStreamCall, i: int) -> str | None:
            try:
                reply = await call.read()
                await call.done_writing()
                return None if reply == b"%d" % i else f"stream {i}: {reply!r}"
            except grpc.RpcError as exc:
                return f"stream {i}: {exc.code()} {exc.details()}"

        outcomes = await asyncio.wait_for(asyncio.gather(*(answer(c, i) for c, i in calls)), 60)
        failures += [o for o in outcomes if o is not None]
        return STREAMS - len(failures), failures
    finally:
        for channel in channels:
            await channel.close()


def test_a_burst_of_streams_while_the_server_loop_is_busy_is_taken_up_whole() -> None:
    """The server's event loop is held until all STREAMS streams have sent their first message (so
    they all wait in grpc's pending queue at once); then every stream is answered."""
    server = _ServerThread()
    server.start()
    assert server.ready.wait(10)
    all_written = threading.Event()

    def busy() -> None:  # the replica's loop busy with other work while the fleet connects
        all_written.wait(30)
        time.sleep(0.5)

    server.loop.call_soon_threadsafe(busy)
    try:
        answered, failures = asyncio.run(_burst(f"127.0.0.1:{server.port}", all_written))
    finally:
        server.stop()
    assert all_written.is_set()
    assert failures == [], f"{len(failures)} of {STREAMS} streams failed, e.g. {failures[:3]}"
    assert answered == STREAMS
