"""Engine and sessions: SQLite (embedded default) or PostgreSQL through psycopg 3."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from smon_server.store.attempts import AgentAttempts
from smon_server.store.kinds import DEFAULT_MAX_PHASE_NAMES, SpanKinds
from smon_server.store.row_keys import RowKeys

__all__ = ["DATABASE_UNAVAILABLE", "Database", "HeldConnection", "Transaction", "make_engine"]

Transaction = Callable[[], AbstractContextManager[Session]]

# The database cannot be reached or dropped the connection: what was asked may succeed later.
DATABASE_UNAVAILABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.DisconnectionError,
    psycopg.OperationalError,
)


def make_engine(database_url: str) -> Engine:
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the API read while ingest writes; the busy timeout absorbs short write contention.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class HeldConnection:
    """Transactions on one connection that a single thread keeps between them (the ingest
    writer, dozens of transactions a second): no pool checkout and liveness ping (a round trip)
    per transaction. A transaction that fails drops the connection, so one broken by the
    database going away is never used again; the next transaction opens a fresh one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._connection: Connection | None = None

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        if self._connection is None:
            self._connection = self.engine.connect()
        try:
            with Session(bind=self._connection) as session, session.begin():
                yield session
        except BaseException:
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

    def __init__(self, database_url: str, *, max_phase_names: int = DEFAULT_MAX_PHASE_NAMES) -> None:
        self.url = database_url
        self.engine = make_engine(database_url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.kinds = SpanKinds(max_phase_names)
        self.attempts = AgentAttempts()
        self.row_keys = RowKeys()

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
