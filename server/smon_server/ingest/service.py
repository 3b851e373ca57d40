"""The gRPC ingest service (grpc.aio): agents stream batches, each is acked once committed.

Requests arrive as raw bytes and are parsed here, so a malformed message gets a clear
INVALID_ARGUMENT instead of grpc's generic deserialisation failure. Valid batches are written by the
group committer (commits.py), many streams' batches per transaction; each Ack carries its
`throttle_seconds` hint. A database failure is answered with UNAVAILABLE and no ack: the agent keeps
the batch and resends it after reconnecting.

Before it ends a stream with an error, the service settles what it read ahead: batches no writer
has taken are withdrawn, those a writer holds are waited for, and those that were stored are acked.
The error then carries `UNSTORED_METADATA`: every batch of the stream left unacked was not stored,
so an agent that exits now can count it as dropped for certain (smon/shipper.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest import wire
from smon_server.ingest.commits import GroupCommitter, OutcomeUnknown, StorageRefused
from smon_server.ingest.limits import ActiveJobs, AgentRates
from smon_server.ingest.validate import BatchRejected, Limits, validate_batch, validate_parts
from smon_server.metrics.ingest_stats import IngestStats
from smon_server.store.db import DATABASE_UNAVAILABLE
from smon_server.store.rows import ValidBatch
from smon_server.store.writes import WriteResult

log = logging.getLogger(__name__)

SERVICE_NAME = "smon.v1.Ingest"
MALFORMED = "malformed"
UNAUTHENTICATED = "unauthenticated"
STORAGE_REFUSED = "storage_refused"  # the database refused the batch's content: never resend it
SEQ_REUSED = "seq_reused"  # (agent_id, seq) already stored with other records
RATE_LIMITED = "rate_limited"  # the agent sends far past SMON_INGEST_AGENT_RECORDS_PER_SECOND
TOO_MANY_JOBS = "too_many_jobs"  # a new job while SMON_INGEST_MAX_JOBS others are reporting
# Batches of one stream taken in before the oldest of them is acked. The agent keeps up to 64
# unacked batches in flight; handling a stream's batches one at a time would make every agent
# wait a whole commit per batch and cap a group at one batch per agent.
STREAM_READ_AHEAD = 8
# Trailing metadata of a stream ended by the server: no batch it left unacked was stored.
UNSTORED_METADATA = (("smon-unacked-not-stored", "1"),)
# The longest flush interval an Ack asks for (the agent caps it at the same: smon.shipper).
MAX_FLUSH_SECONDS = 10.0
# What a rank's batch carried in a host relay's message costs this replica, as a share of a
# batch on its own stream (the message's parse, event-loop task, group-commit entry and Ack are
# shared by its parts): 403-418 µs of server CPU against 761-916 µs in three measured pairs,
# `benchmarks/fleet.py` with and without `--ranks-per-host 8` (docs/storage.md). flush_seconds
# counts each relayed rank as this much of a batch.
RELAYED_PART_COST = 0.5
# A batch that waits longer than this from arrival to commit means the replica is past its
# capacity: its Ack asks the agent to hold back for about that long (Ack.throttle_seconds).
OVERLOAD_SECONDS = 1.0
# Streams grpc's core may hold that this process has not yet taken up, and for how long. grpc.aio's
# server asks its core for one new call at a time, from its event loop; streams that arrive faster
# wait in the core's pending queue, and by default the core refuses new ones past 1,000 waiting
# (some) and 3,000 (all), and ends those that waited 30 s (RESOURCE_EXHAUSTED or CANCELLED; a
# client still writing reads "Internal error from Core"). A fleet that starts at once, or
# reconnects at once after a replica restarts, opens thousands of streams within a second, and a
# replica busy with the batches of those already open takes up the rest slowly: 8,000 agents had
# 1,828 streams refused at the start, and the reconnect storm kept the replica saturated
# (docs/storage.md). A waiting stream costs the core a few kB; its agent's batches wait with it.
MAX_PENDING_STREAMS = 1_000_000
MAX_PENDING_SECONDS = 600

_AckT = TypeVar("_AckT", pb.Ack, pb.HostAck)


class _Refused(Exception):
    """The request cannot be answered with an Ack: end the call with this status. `certain`:
    the batch was not stored (False: the database went away during its commit)."""

    def __init__(self, code: grpc.StatusCode, details: str, *, certain: bool = True) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.certain = certain


class IngestService:
    def __init__(
        self,
        committer: GroupCommitter,
        stats: IngestStats,
        *,
        limits: Limits,
        token: str | None = None,
        clock: Callable[[], float] = time.time,
        on_final: Callable[[], None] | None = None,
        rates: AgentRates | None = None,
        jobs: ActiveJobs | None = None,
        batches_per_second: float = 0.0,
    ) -> None:
        self.batches_per_second = batches_per_second
        self.streams = 0  # agent streams open now (a host relay's stream counts as one)
        self.host_streams = 0  # of which host relays' streams (StreamHost)
        self._host_parts = 0  # the batches of each host stream's latest message, summed
        self._dephase = random.Random()
        self._latency = 0.0  # arrival to commit of recent batches, seconds (EWMA)
        self.rates = rates
        self.jobs = jobs
        self.on_final = on_final  # an agent said goodbye: its job may have finished, analyse now
        self.committer = committer
        self.stats = stats
        self.limits = limits
        self.token = token
        self.clock = clock

    def handler(self) -> grpc.GenericRpcHandler:
        serialize = pb.Ack.SerializeToString
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Stream": grpc.stream_stream_rpc_method_handler(self.stream, response_serializer=serialize),
                "Push": grpc.unary_unary_rpc_method_handler(self.push, response_serializer=serialize),
                "StreamHost": grpc.stream_stream_rpc_method_handler(
                    self.stream_host, response_serializer=pb.HostAck.SerializeToString
                ),
                "Clock": grpc.unary_unary_rpc_method_handler(
                    self.clock_rpc,
                    request_deserializer=pb.ClockRequest.FromString,
                    response_serializer=pb.ClockReply.SerializeToString,
                ),
            },
        )

    async def push(self, request: bytes, context: grpc.aio.ServicerContext) -> pb.Ack:
        await self._authenticate(context)
        try:
            return await self._handle(request)
        except _Refused as refused:
            await context.abort(refused.code, refused.details)
            raise  # abort raises; this only satisfies type checkers

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        """Batches are read ahead of their Acks (up to STREAM_READ_AHEAD), so several of an
        agent's batches can wait for, and share, the same commit; Acks go out in order (but for
        those settled as a failure ends the stream: an Ack names its seq)."""
        await self._authenticate(context)
        self.streams += 1
        self.stats.streams.set(self.streams)
        try:
            if flush := self.flush_seconds():
                # Past its size, the replica says so as the stream opens (an Ack of no batch, seq
                # 0): a fleet starting at once would otherwise send a second's batches each until
                # their first Acks come back, behind the very backlog they make. And it spreads
                # the streams' first batches over the interval (a hold of a random part of it):
                # ranks that start together, or reconnect together after a replica restarts,
                # would otherwise flush in the same second of every interval.
                hold = self._dephase.uniform(0.0, flush)
                yield pb.Ack(flush_seconds=flush, step_tables=True, throttle_seconds=hold)
            async for ack in self._stream(requests, context, self._handle):
                yield ack
        finally:
            self.streams -= 1
            self.stats.streams.set(self.streams)

    async def stream_host(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.HostAck]:
        """A host relay's stream (agent/smon/relay.py): each HostBatch carries several ranks'
        batches and is answered by one HostAck once all of them are settled. It is one stream to
        flow control (flush_seconds counts it once, throttle_seconds holds the whole host), and its
        parts share one parse of the message, one pass through the group committer and one Ack
        message, where N direct streams pay each of those N times."""
        await self._authenticate(context)
        self.streams += 1
        self.host_streams += 1
        self.stats.streams.set(self.streams)
        weight = 1  # this stream's ranks, as its latest message counted them
        self._host_parts += weight

        def weigh(parts: int) -> None:
            nonlocal weight
            self._host_parts += max(1, parts) - weight
            weight = max(1, parts)

        async def handle(request: bytes) -> pb.HostAck:
            return await self._handle_host(request, weigh)

        try:
            if flush := self.flush_seconds():
                hold = self._dephase.uniform(0.0, flush)
                yield pb.HostAck(flush_seconds=flush, throttle_seconds=hold)
            async for ack in self._stream(requests, context, handle):
                yield ack
        finally:
            self.streams -= 1
            self.host_streams -= 1
            self._host_parts -= weight
            self.stats.streams.set(self.streams)

    async def _stream(
        self,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
        handle: Callable[[bytes], Awaitable[_AckT]],
    ) -> AsyncIterator[_AckT]:
        handled: asyncio.Queue[asyncio.Task[_AckT] | None] = asyncio.Queue()
        # A task is made only once there is room: a reader stopped while it waits leaves no batch
        # being stored with nobody to ack it.
        room = asyncio.Semaphore(STREAM_READ_AHEAD)

        async def read() -> None:
            try:
                async for request in requests:
                    await room.acquire()
                    handled.put_nowait(asyncio.ensure_future(handle(request)))
            finally:
                handled.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (task := await handled.get()) is not None:
                room.release()
                try:
                    ack = await task
                except _Refused as refused:
                    settled, certain = await _settle_read_ahead(reader, handled)
                    for settled_ack in settled:
                        yield settled_ack
                    promise = UNSTORED_METADATA if certain and refused.certain else ()
                    await context.abort(refused.code, refused.details, trailing_metadata=promise)
                yield ack
            await reader  # a failure to read the requests ends the call with it
        finally:
            reader.cancel()
            tasks = [t for t in _drain(handled) if t is not None]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            for task in tasks:  # their outcomes are read, whoever no longer waits for them
                task.add_done_callback(_retrieve)

    async def clock_rpc(self, request: pb.ClockRequest, context: grpc.aio.ServicerContext) -> pb.ClockReply:
        await self._authenticate(context)
        return pb.ClockReply(agent_time=request.agent_time, server_time=self.clock())

    async def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        if not self.token:
            return
        metadata = dict(context.invocation_metadata() or ())
        presented = str(metadata.get("authorization", ""))
        if not hmac.compare_digest(presented.encode(), f"Bearer {self.token}".encode()):
            self.stats.rejected.labels(UNAUTHENTICATED).inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong ingest token")

    def load(self) -> float:
        """The batches a second this replica's agents send (at the flush interval it asks for) over
        those it takes (SMON_INGEST_BATCHES_PER_SECOND): 1 once it asks agents to flush less
        often; 0 when unlimited. The analysis takes its spare worker only while this is low
        (jobs/worker_shares.py)."""
        return min(1.0, self._demand())

    def _demand(self) -> float:
        """Batches a second the open streams would send at a 1 s flush, over those this replica
        takes (a relayed rank at `RELAYED_PART_COST`); 0 when unlimited."""
        if self.batches_per_second <= 0:
            return 0.0
        parts = RELAYED_PART_COST * self._host_parts
        return (self.streams - self.host_streams + parts) / self.batches_per_second

    def flush_seconds(self) -> float:
        """The flush interval to ask agents for: open streams over the batches a second this
        replica takes, when that is over a second (agents flush every second by default). A host
        relay's stream counts as the ranks it carries (the parts of its latest message), each at
        what its batch costs the replica beside a direct stream's (`RELAYED_PART_COST`): a
        replica sized for N direct ranks takes about 2N relayed ones at the same interval, and
        asks N relayed ones to flush twice as often, so their steps reach the analysis sooner
        (docs/server.md)."""
        wanted = self._demand()
        return 0.0 if wanted <= 1.0 else min(MAX_FLUSH_SECONDS, round(wanted, 1))

    def _overload_seconds(self, waited: float) -> float:
        """How long to hold an agent back because batches wait too long to be committed."""
        self._latency = 0.7 * self._latency + 0.3 * waited
        if self._latency <= OVERLOAD_SECONDS:
            return 0.0
        self.stats.overloaded.inc()
        return min(MAX_FLUSH_SECONDS, 2 * self._latency)

    async def _handle(self, request: bytes) -> pb.Ack:
        arrived = time.monotonic()
        try:
            batch = pb.Batch.FromString(request)
        except DecodeError as exc:
            self.stats.rejected.labels(MALFORMED).inc()
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"malformed smon.v1.Batch: {exc}") from exc
        admitted = self._admit(batch)
        if isinstance(admitted, pb.Ack):
            return admitted
        valid, hold = admitted
        outcome: WriteResult | BaseException
        try:
            outcome = await self.committer.write(valid)
        except Exception as exc:
            outcome = exc
        overload = self._overload_seconds(time.monotonic() - arrived)
        return self._acked(batch, outcome, hold, overload)

    async def _handle_host(self, request: bytes, weigh: Callable[[int], None] | None = None) -> pb.HostAck:
        """Settle every part of a HostBatch: each is parsed, validated and refused alone, the valid
        ones go to the committer together (one group), and the HostAck answers them in part order.
        A database that is away fails the whole message (the relay's ranks resend, as on Stream)."""
        arrived = time.monotonic()
        try:
            host = pb.HostBatch.FromString(request)
        except DecodeError as exc:
            self.stats.rejected.labels(MALFORMED).inc()
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"malformed smon.v1.HostBatch: {exc}") from exc
        if weigh is not None:
            weigh(len(host.parts))  # the stream's ranks, for flush_seconds
        acks: list[pb.Ack | None] = [None] * len(host.parts)
        parsed: list[tuple[int, pb.Batch]] = []
        for index, part in enumerate(host.parts):
            try:
                parsed.append((index, pb.Batch.FromString(part)))
            except DecodeError as exc:
                self.stats.rejected.labels(MALFORMED).inc()
                rejection = pb.Rejection(
                    kind="batch", index=-1, reason=MALFORMED, detail=f"malformed smon.v1.Batch: {exc}"
                )
                acks[index] = pb.Ack(rejections=[rejection], step_tables=True)
        # The parts' StepTables checked as one set of columns where they fit together.
        checked = validate_parts([batch for _, batch in parsed], self.limits)
        admitted: list[tuple[int, pb.Batch, ValidBatch, float]] = []
        for (index, batch), valid in zip(parsed, checked, strict=True):
            outcome = self._admit(batch, valid)
            if isinstance(outcome, pb.Ack):
                acks[index] = outcome
            else:
                admitted.append((index, batch, *outcome))
        results: list[WriteResult | BaseException] = []
        if admitted:
            results = await self.committer.write_many([valid for _, _, valid, _ in admitted])
        overload = self._overload_seconds(time.monotonic() - arrived) if admitted else 0.0
        refused: _Refused | None = None
        certain = True
        for (index, batch, _, hold), result in zip(admitted, results, strict=True):
            try:
                acks[index] = self._acked(batch, result, hold, overload)
            except _Refused as exc:
                refused = refused or exc
                certain = certain and exc.certain
        if refused is not None:
            # A part stored beside one that was not goes unacked too: its resend is a duplicate.
            stored = any(not isinstance(result, BaseException) for result in results)
            raise _Refused(refused.code, refused.details, certain=certain and not stored)
        answered = [ack for ack in acks if ack is not None]  # every part has its Ack by now
        return pb.HostAck(
            seq=host.seq,
            acks=answered,
            throttle_seconds=max((a.throttle_seconds for a in answered), default=0.0),
            flush_seconds=self.flush_seconds(),
        )

    def _admit(
        self, batch: pb.Batch, valid: ValidBatch | BatchRejected | None = None
    ) -> tuple[ValidBatch, float] | pb.Ack:
        """The batch's storable rows (validated here unless `valid` is its outcome already) and how
        long its agent must hold back, or an Ack refusing it."""
        if valid is None:
            try:
                valid = validate_batch(batch, self.limits)
            except BatchRejected as rejected:
                valid = rejected
        if isinstance(valid, BatchRejected):
            return self._refuse_whole(batch, valid.reason, valid.detail)
        if self.jobs is not None and not self.jobs.admit(valid.job_id):
            detail = f"{self.jobs.max_jobs} other jobs are reporting (SMON_INGEST_MAX_JOBS)"
            return self._refuse_whole(batch, TOO_MANY_JOBS, detail)
        hold = self.rates.take(valid.agent_id, valid.accepted) if self.rates is not None else 0.0
        if hold is None:
            return self._refuse_whole(batch, RATE_LIMITED, "records per second far past the agent's limit")
        return valid, hold

    def _acked(
        self, batch: pb.Batch, outcome: WriteResult | BaseException, hold: float, overload: float
    ) -> pb.Ack:
        """The Ack of a batch the committer settled, or _Refused when it must be resent."""
        if isinstance(outcome, StorageRefused):
            return self._refuse_whole(batch, STORAGE_REFUSED, str(outcome))
        if isinstance(outcome, DATABASE_UNAVAILABLE):  # the outage log says so, once (store/availability.py)
            self.committer.db.availability.failed(outcome, "ingest batches refused")
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "storage unavailable; resend later") from outcome
        if isinstance(outcome, OutcomeUnknown):
            self.committer.db.availability.failed(outcome.cause, "ingest batches refused")
            raise _Refused(
                grpc.StatusCode.UNAVAILABLE, "storage unavailable; resend later", certain=False
            ) from outcome
        if isinstance(outcome, asyncio.CancelledError):
            raise outcome
        if isinstance(outcome, BaseException):  # logged with its traceback by the committer
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "storage failed; resend later") from outcome
        result = outcome
        if result.conflict:
            detail = f"seq {batch.seq} of agent {batch.agent_id} was stored before with other records"
            return self._refuse_whole(batch, SEQ_REUSED, detail)
        valid = result.stored
        self._count(valid, duplicate=result.duplicate)
        if result.folded_spans:
            self.stats.folded_spans.inc(result.folded_spans)
        if valid.final and self.on_final is not None:
            self.on_final()
        flush = self.flush_seconds()
        self.stats.flush_seconds.set(flush)
        return pb.Ack(
            agent_id=valid.agent_id,
            seq=valid.seq,
            accepted=valid.accepted,
            rejected=len(valid.rejections),
            rejections=wire.rejections(valid.rejections),
            duplicate=result.duplicate,
            throttle_seconds=max(hold, overload, self.committer.throttle_seconds()),
            step_tables=True,
            flush_seconds=flush,
        )

    def _refuse_whole(self, batch: pb.Batch, reason: str, detail: str) -> pb.Ack:
        """An Ack that refuses every record of the batch for good: the agent drops it, never resends."""
        self.stats.rejected.labels(reason).inc()
        return pb.Ack(
            agent_id=batch.agent_id,
            seq=batch.seq,
            # Declared counts can add up past Ack.rejected's uint32.
            rejected=min(len(batch.steps) + batch.step_table.records + len(batch.gpu_samples), 2**32 - 1),
            rejections=[pb.Rejection(kind="batch", index=-1, reason=reason, detail=detail)],
            step_tables=True,
        )

    def _count(self, valid: ValidBatch, *, duplicate: bool) -> None:
        if duplicate:
            self.stats.duplicates.inc()
            return
        self.stats.records.labels("batch").inc()
        if valid.steps:
            self.stats.records.labels("step").inc(len(valid.steps))
        if valid.gpu_samples:
            self.stats.records.labels("gpu_sample").inc(len(valid.gpu_samples))
        if valid.heartbeat is not None:
            self.stats.records.labels("heartbeat").inc()
        for rejection in valid.rejections:
            self.stats.rejected.labels(rejection.reason).inc()
        if valid.unknown_fields:
            self.stats.unknown_fields.inc(valid.unknown_fields)


async def _settle_read_ahead(
    reader: asyncio.Task[None], handled: asyncio.Queue[asyncio.Task[_AckT] | None]
) -> tuple[list[_AckT], bool]:
    """Stop reading; of the batches read ahead, withdraw those no writer holds and wait for the
    rest. Returns the Acks of those that were stored (an Ack names its seq: order is free), and
    whether every other one is certainly not stored."""
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await reader
    tasks = [t for t in _drain(handled) if t is not None]
    for task in tasks:
        task.cancel()
    acks: list[_AckT] = []
    certain = True
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, (pb.Ack, pb.HostAck)):
            acks.append(outcome)
        elif isinstance(outcome, _Refused):
            certain = certain and outcome.certain
        elif not isinstance(outcome, asyncio.CancelledError):
            certain = False
    return acks, certain


def _drain(handled: asyncio.Queue[asyncio.Task[_AckT] | None]) -> list[asyncio.Task[_AckT] | None]:
    drained = []
    while not handled.empty():
        drained.append(handled.get_nowait())
    return drained


def _retrieve(task: asyncio.Task[pb.Ack] | asyncio.Task[pb.HostAck]) -> None:
    if not task.cancelled():
        task.exception()


def make_grpc_server(service: IngestService, *, max_message_bytes: int) -> grpc.aio.Server:
    """A grpc.aio server with keepalive settings matching the agent's channel options, that
    takes up every stream a fleet opens at once (MAX_PENDING_STREAMS)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            # The agents' keepalive (30 s) is welcome: pings at least 10 s apart are never
            # counted as abuse ("grpc.http2.min_recv_ping_interval_without_data_ms", the name
            # this had before, is no grpc option: the default of 5 minutes applied).
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.server.max_pending_requests", MAX_PENDING_STREAMS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_STREAMS),
            ("grpc.server_max_unrequested_time_in_server", MAX_PENDING_SECONDS),
        ],
    )
    server.add_generic_rpc_handlers((service.handler(),))
    return server
