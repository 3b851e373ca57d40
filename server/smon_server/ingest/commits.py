"""Group commit: batches from every agent stream share transactions, and agents are slowed down
when the database falls behind.

Writer threads (`writers`, each with its own connection; one on SQLite) own the database writes.
Whatever batches arrived while a writer was committing its previous group go into its next
transaction together (up to `max_group_records`), so the per-transaction costs (the commit's WAL
flush, the job and agent upserts, the COPY set-up) are paid once per group instead of once per
batch: at many agents the group grows with the load, the way PostgreSQL's own commit_delay groups
WAL flushes. With two writers one builds its group's rows while the other's COPY and commit run in
PostgreSQL; their groups of one job meet only on the job's row, locked for the last statements
before each commit (store/row_keys.py). A batch's Ack is sent only after the transaction holding it
commits.

Backpressure, in two steps. Past half of `max_pending_records` waiting to be written, every Ack
carries `throttle_seconds` (the time the backlog takes to drain at the measured write rate), and
agents hold their records back that long, then send them in fewer, larger batches. At the limit,
a stream's next batch waits before it is taken in; the agent's unacked window fills and its
records wait in its own bounded queue. Nothing waiting here is acked.

A group the database refuses is written again batch by batch, so one bad batch fails alone and
the others beside it are stored. A batch the database refuses for its content (a value too long
or too large for its column, a byte it cannot store: sqlalchemy's DataError / IntegrityError)
would be refused again on every resend, and the agent would resend it forever ahead of all its
newer records; it fails with StorageRefused, which the service answers with a permanent rejection
(`storage_refused`) so the agent drops it and goes on. A database that is away (down,
unreachable, or not answering within SMON_DATABASE_STATEMENT_TIMEOUT) fails the whole group at
once, without a retry per batch, and is reported to the process's outage log
(store/availability.py): one line when it goes, one when it is back. The service answers
UNAVAILABLE, and the agent resends.

A batch whose caller stops waiting (its stream ended) is withdrawn if no writer has taken it
yet, so it is never stored behind an agent's back; one already in a transaction has its outcome
decided there, and the caller, asked once to stop, still learns it (ingest/service.py acks what
was stored before it ends a stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from sqlalchemy import exc as sa_exc

from smon_server.store.attempts import DEFAULT_STALL_SECONDS
from smon_server.store.db import DATABASE_UNAVAILABLE, Database, HeldConnection
from smon_server.store.rows import ValidBatch
from smon_server.store.writes import WriteResult, write_batches

log = logging.getLogger(__name__)

# A batch's future and what its commit came to, handed back to the batch's event loop.
_Outcome = tuple["asyncio.Future[WriteResult]", "WriteResult | BaseException"]

MAX_THROTTLE_SECONDS = 5.0
# Refusals of a batch's content: resending the same batch cannot succeed. (Raw COPY raises
# psycopg's own classes; OverflowError is SQLite's refusal of an integer past 64 bits.)
_CONTENT_ERRORS = (
    sa_exc.DataError,
    sa_exc.IntegrityError,
    psycopg.DataError,
    psycopg.IntegrityError,
    OverflowError,
)


class StorageRefused(Exception):
    """The database refused this batch's content; resending it would fail the same way."""


class OutcomeUnknown(Exception):
    """The database went away while committing this batch's transaction: it may be stored.
    (A resend is safe: a stored batch is found by its seq and acked as a duplicate.)"""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class _Item:
    batch: ValidBatch
    future: asyncio.Future[WriteResult]
    loop: asyncio.AbstractEventLoop
    state: str = "queued"  # -> "taken" by a writer, or "withdrawn" by its caller

    @property
    def records(self) -> int:
        return max(1, self.batch.accepted)


class GroupCommitter:
    def __init__(
        self,
        db: Database,
        *,
        max_group_records: int = 50_000,
        max_pending_records: int = 200_000,
        clock: Callable[[], float] = time.time,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        writers: int = 1,
        linger_seconds: float = 0.0,
    ) -> None:
        self.db = db
        # How long a writer waits for more batches after the first of a group (Kafka's linger.ms).
        # A group's own cost (a transaction's statements, their set-up in Python) is paid once per
        # group: at a fleet's many small batches a second, groups of one or two would pay it for
        # nearly every batch.
        self.linger_seconds = linger_seconds
        self.stall_seconds = stall_seconds  # a new agent after this much silence is a new attempt
        self.max_group_records = max_group_records
        self.max_pending_records = max_pending_records
        self.clock = clock
        # An entry is one batch, or a host's batches (write_many), which a writer takes together.
        self._items: queue.SimpleQueue[_Item | list[_Item] | None] = queue.SimpleQueue()
        self._pending = 0  # records taken in and not yet settled (event loop only)
        self._room: asyncio.Event | None = None  # set whenever pending records go down
        self._claims = threading.Lock()  # an item is taken by a writer or withdrawn, never both
        self._rate = 0.0  # records/s of recent groups (EWMA), for the throttle hint
        self.groups = 0  # groups committed (a test reads it)
        # SQLite takes one writer at a time whatever the threads do.
        self.writers = writers if db.engine.dialect.name == "postgresql" else 1
        self._threads: list[threading.Thread] = []
        self._local = threading.local()  # each writer thread's own HeldConnection
        self._groups_lock = threading.Lock()

    @property
    def _connection(self) -> HeldConnection:
        held: HeldConnection | None = getattr(self._local, "connection", None)
        if held is None:
            held = self._local.connection = HeldConnection(self.db.engine)
        return held

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._run, name=f"smon-writer-{i}", daemon=True)
            for i in range(self.writers)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish what was taken in, then end the writer threads."""
        for _ in self._threads:
            self._items.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def throttle_seconds(self) -> float:
        """How long agents should hold back: the backlog's drain time, once it is past half full."""
        if self._pending < self.max_pending_records / 2:
            return 0.0
        rate = self._rate or 1_000.0
        return min(MAX_THROTTLE_SECONDS, self._pending / rate)

    async def write(self, batch: ValidBatch) -> WriteResult:
        """Store `batch` in the next group; returns once that group is committed."""
        if not self._threads:
            raise RuntimeError("GroupCommitter.start() was not called")
        loop = asyncio.get_running_loop()
        room = self._room = self._room or asyncio.Event()
        item = _Item(batch, loop.create_future(), loop)
        # Whoever stops waiting for it, its outcome is read: no "exception was never retrieved".
        item.future.add_done_callback(_retrieve)
        # A batch larger than the whole limit still goes in, alone, once nothing else waits.
        while not (self._pending == 0 or self._pending + item.records <= self.max_pending_records):
            room.clear()
            await room.wait()
        self._pending += item.records
        try:
            self._items.put(item)
            try:
                return await asyncio.shield(item.future)
            except asyncio.CancelledError:
                if self._claim(item, "withdrawn"):
                    raise  # no writer had it: it will never be stored
            # A writer has it in a transaction: wait for the outcome (bounded by the database's
            # own timeouts) so the caller can ack it if it was stored. A second cancel gives up.
            return await asyncio.shield(item.future)
        finally:
            self._pending -= item.records
            room.set()

    async def write_many(self, batches: list[ValidBatch]) -> list[WriteResult | BaseException]:
        """Store a host's batches (ingest/service.py, StreamHost) in one group: they enter the
        queue as one entry, so a writer takes them together and pays a group's cost once for them
        all. Returns each batch's outcome, an exception where it was not stored (as write() raises)."""
        if not self._threads:
            raise RuntimeError("GroupCommitter.start() was not called")
        if not batches:
            return []
        loop = asyncio.get_running_loop()
        room = self._room = self._room or asyncio.Event()
        items = [_Item(batch, loop.create_future(), loop) for batch in batches]
        # One future for the message, set once every part is settled: a shield and a gather of
        # the parts' own futures cost the event loop ~6% of a replica's ingest at 16,384
        # relayed ranks (py-spy, docs/storage.md).
        settled = loop.create_future()
        left = len(items)

        def one_settled(future: asyncio.Future[WriteResult]) -> None:
            nonlocal left
            _retrieve(future)
            left -= 1
            if left == 0 and not settled.done():
                settled.set_result(None)

        for item in items:
            item.future.add_done_callback(one_settled)
        records = sum(item.records for item in items)
        while not (self._pending == 0 or self._pending + records <= self.max_pending_records):
            room.clear()
            await room.wait()
        self._pending += records
        try:
            self._items.put(items)
            try:
                await asyncio.shield(settled)
                return [_outcome(item.future) for item in items]
            except asyncio.CancelledError:
                # Those no writer took are withdrawn; the rest are waited for, as write() does.
                withdrawn = [self._claim(item, "withdrawn") for item in items]
                if all(withdrawn):
                    raise
            taken = [item.future for item, gone in zip(items, withdrawn, strict=True) if not gone]
            await asyncio.gather(*(asyncio.shield(f) for f in taken), return_exceptions=True)
            return [
                asyncio.CancelledError() if gone else _outcome(item.future)
                for item, gone in zip(items, withdrawn, strict=True)
            ]
        finally:
            self._pending -= records
            room.set()

    def _claim(self, item: _Item, state: str) -> bool:
        """Move a queued item to `state` ("taken" or "withdrawn"); False if it left the queue."""
        with self._claims:
            if item.state != "queued":
                return False
            item.state = state
            return True

    # -- the writer thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            first = self._items.get()
            if first is None:
                self._connection.close()
                return
            group: list[_Item] = []
            records, stop = 0, False
            item: _Item | list[_Item] | None = first
            until = time.monotonic() + self.linger_seconds
            while item is not None:
                for one in item if isinstance(item, list) else (item,):
                    if self._claim(one, "taken"):  # a withdrawn one is skipped
                        group.append(one)
                        records += one.records
                if records >= self.max_group_records:
                    break
                try:
                    item = self._items.get_nowait()
                except queue.Empty:
                    wait = until - time.monotonic()
                    if wait <= 0:
                        break
                    try:
                        item = self._items.get(timeout=wait)
                    except queue.Empty:
                        break
                stop = item is None
            if group:
                self._commit(group, records)
            if stop:
                self._connection.close()
                return

    def _commit(self, group: list[_Item], records: int) -> None:
        started = time.perf_counter()
        try:
            results: list[WriteResult | BaseException] = list(
                write_batches(
                    self.db,
                    [i.batch for i in group],
                    self.clock(),
                    stall_seconds=self.stall_seconds,
                    transaction=self._connection.transaction,
                )
            )
        except DATABASE_UNAVAILABLE as exc:
            # The database is away: each batch alone would only wait for it again.
            self.db.availability.failed(exc)
            results = [self._unavailable(exc)] * len(group)
        except Exception as exc:
            if len(group) == 1:
                results = [self._failure(group[0], exc)]
            else:
                log.warning("a group of %d batches failed (%s); writing them one by one", len(group), exc)
                results = [self._alone(i) for i in group]
        else:
            self.db.availability.succeeded()
        seconds = time.perf_counter() - started
        with self._groups_lock:
            self.groups += 1
        if seconds > 0:
            rate = records / seconds
            self._rate = rate if not self._rate else 0.8 * self._rate + 0.2 * rate
        # One wake-up of each event loop for the whole group: a call per batch wrote the loop's
        # self-pipe once per batch (~6% of a replica's ingest at 16,384 relayed ranks).
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for item, result in zip(group, results, strict=True):
            by_loop.setdefault(item.loop, []).append((item.future, result))
        for loop, outcomes in by_loop.items():
            # RuntimeError: its event loop is closed (the server stopped), nobody waits.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle_all, outcomes)

    def _alone(self, item: _Item) -> WriteResult | BaseException:
        try:
            batch = [item.batch]
            return write_batches(
                self.db,
                batch,
                self.clock(),
                stall_seconds=self.stall_seconds,
                transaction=self._connection.transaction,
            )[0]
        except Exception as exc:
            return self._failure(item, exc)

    def _failure(self, item: _Item, exc: Exception) -> BaseException:
        """What one batch's failure is: refused for its content (for good), the database away
        (counted by the outage log), or unexpected (a traceback: a bug to look at)."""
        batch = item.batch
        if isinstance(exc, _CONTENT_ERRORS):
            detail = str(getattr(exc, "orig", None) or exc).splitlines()[0][:300]
            log.warning(
                "the database refused batch %s/%d of job %s: %s",
                batch.agent_id,
                batch.seq,
                batch.job_id,
                detail,
            )
            return StorageRefused(detail)
        if isinstance(exc, DATABASE_UNAVAILABLE):
            self.db.availability.failed(exc)
            return self._unavailable(exc)
        log.error("storing batch %s/%d failed", batch.agent_id, batch.seq, exc_info=exc)
        return exc

    def _unavailable(self, exc: Exception) -> BaseException:
        return OutcomeUnknown(exc) if self._connection.commit_unknown else exc


def _retrieve(future: asyncio.Future[WriteResult]) -> None:
    if not future.cancelled():
        future.exception()


def _outcome(future: asyncio.Future[WriteResult]) -> WriteResult | BaseException:
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception() or future.result()


def _settle_all(outcomes: list[_Outcome]) -> None:
    for future, result in outcomes:
        _settle(future, result)


def _settle(future: asyncio.Future[WriteResult], result: WriteResult | BaseException) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
