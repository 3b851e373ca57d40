"""Engine and sessions: SQLite (embedded default) or PostgreSQL through psycopg 3.

Every wait for the database is bounded. A database that refuses connections fails fast by
itself; one that hangs (a stopped process, a proxy or disk that stopped answering, a network
that drops packets) used to leave every request, scrape and ingest write waiting for it for as
long as it hung. On PostgreSQL a connection gives up after `connect_timeout` seconds (psycopg's
own, whole seconds, at least 2) and each round trip of a statement (execute, fetch, COPY,
commit) after `answer_timeout`: the statement is cancelled where the server still listens, the
connection closed, and the caller gets a psycopg OperationalError like any database that is away
(503, UNAVAILABLE, an analysis pass skipped). On SQLite the same bound is the busy timeout (a
lock another writer holds). `answer_deadline()` gives a stretch of code other bounds: shorter for
the probes (/readyz, /metrics), none for migrations.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import capabilities
from psycopg.abc import RV, PQGen
from psycopg.errors import _WaitTimeout
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from smon_server.store.attempts import AgentAttempts
from smon_server.store.availability import Availability
from smon_server.store.kinds import DEFAULT_MAX_PHASE_NAMES, SpanKinds
from smon_server.store.row_keys import RowKeys

if TYPE_CHECKING:
    from smon_server.settings import Settings

__all__ = [
    "DATABASE_UNAVAILABLE",
    "AnswerTimeout",
    "Database",
    "HeldConnection",
    "Transaction",
    "answer_deadline",
    "make_engine",
]

Transaction = Callable[[], AbstractContextManager[Session]]

# The database cannot be reached, dropped the connection, or did not answer in time: what was
# asked may succeed later. (sqlalchemy's TimeoutError: no pooled connection came free in time.)
DATABASE_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,
    psycopg.OperationalError,
)

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_ANSWER_TIMEOUT = 30.0
# A statement given up on is cancelled on the server, if the server takes the request this fast.
_CANCEL_SECONDS = 1.0
_UNSET = object()
_deadlines = threading.local()


class AnswerTimeout(psycopg.OperationalError):
    """The database did not answer a statement in time (it hangs, or the network to it does)."""


@contextmanager
def answer_deadline(seconds: float | None) -> Iterator[None]:
    """Within this block, on this thread, each wait for PostgreSQL is bounded by `seconds`
    instead of the connection's own bound (None: unbounded; migrations). A connection opened
    meanwhile waits at most that long too (psycopg: whole seconds, at least 2)."""
    previous = getattr(_deadlines, "seconds", _UNSET)
    _deadlines.seconds = seconds
    try:
        yield
    finally:
        if previous is _UNSET:
            del _deadlines.seconds
        else:
            _deadlines.seconds = previous


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server has a deadline (see the module)."""

    answer_timeout: float | None = None

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        if timeout is not None:  # psycopg's own bounded waits (cancellation, notifies)
            return super().wait(gen, interval, timeout)
        limit = getattr(_deadlines, "seconds", self.answer_timeout)
        if limit is None:
            return super().wait(gen, interval)
        try:
            return super().wait(gen, interval, limit)
        except _WaitTimeout:
            if capabilities.has_cancel_safe():  # else cancel() could block on a hung server
                with contextlib.suppress(Exception):
                    self.cancel_safe(timeout=_CANCEL_SECONDS)
            self.pgconn.finish()  # stopped mid-protocol: the connection cannot be used again
            raise AnswerTimeout(
                f"the database did not answer within {limit:g} s (SMON_DATABASE_STATEMENT_TIMEOUT)"
            ) from None


def make_engine(
    database_url: str,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    answer_timeout: float | None = DEFAULT_ANSWER_TIMEOUT,
) -> Engine:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        busy = answer_timeout if answer_timeout is not None else 3600.0
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": busy})
        event.listen(engine, "connect", _sqlite_pragmas(busy))
        return engine
    engine = create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=20,
        # A checkout waits for a pooled connection at most as long as for an answer.
        pool_timeout=answer_timeout or 30.0,
    )

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> BoundedConnection:
        configured = float(cparams.get("connect_timeout") or connect_timeout)  # the URL's own wins
        bound = getattr(_deadlines, "seconds", None)
        seconds = configured if bound is None else min(configured, bound)
        params = {**cparams, "connect_timeout": max(2, round(seconds))}
        connection = BoundedConnection.connect(*cargs, **params)
        connection.answer_timeout = answer_timeout
        return connection

    return engine


def _sqlite_pragmas(busy_seconds: float) -> Any:
    def pragmas(dbapi_connection: Any, _record: Any) -> None:
        # WAL lets the API read while ingest writes; the busy timeout absorbs write contention.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_seconds * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return pragmas


class HeldConnection:
    """Transactions on one connection that a single thread keeps between them (the ingest
    writer, dozens of transactions a second): no pool checkout and liveness ping (a round trip)
    per transaction. A transaction that fails drops the connection, so one broken by the
    database going away is never used again; the next transaction opens a fresh one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Connection | None = None
        # The last transaction failed in its COMMIT for want of the database (no answer, the
        # connection lost): it may have been committed all the same.
        self.commit_unknown = False

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        self.commit_unknown = committing = False
        if self._connection is None:
            self._connection = self.engine.connect()
        try:
            with Session(bind=self._connection) as session, session.begin():
                yield session
                committing = True  # leaving the block commits
        except BaseException as exc:
            self.commit_unknown = committing and isinstance(exc, DATABASE_UNAVAILABLE)
            self.close()
            raise

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.close()
            except Exception:  # a connection that broke may fail to close too
                connection.invalidate()


class Database:
    """An engine and its session factory; one per server process."""

    def __init__(
        self,
        database_url: str,
        *,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        answer_timeout: float | None = DEFAULT_ANSWER_TIMEOUT,
        max_phase_names: int = DEFAULT_MAX_PHASE_NAMES,
    ) -> None:
        self.url = database_url
        self.engine = make_engine(
            database_url, connect_timeout=connect_timeout, answer_timeout=answer_timeout
        )
        self.availability = Availability()
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.kinds = SpanKinds(max_phase_names)
        self.attempts = AgentAttempts()
        self.row_keys = RowKeys()

    @classmethod
    def from_settings(cls, settings: Settings) -> Database:
        return cls(
            settings.database_url,
            connect_timeout=settings.database_connect_timeout,
            answer_timeout=settings.database_statement_timeout,
            max_phase_names=settings.max_phase_names,
        )

    @property
    def is_postgres(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
