"""Which server replicas are alive, as PostgreSQL itself knows it.

Each replica holds a session-level advisory lock (class `REPLICA_LOCK_CLASS`, key: the replica's
own random number) on a connection it keeps for as long as its process lives. The set of replicas
is then the set of those locks in `pg_locks`: a replica that exits, is killed or loses its
connection drops out at once (the server ends its session), with no table to update, no heartbeat
to time out and no migration. The analysis loop divides the jobs among that set
(jobs/affinity.py). A replica whose host vanishes without closing its TCP connection stays listed
until PostgreSQL's keepalive notices; the loop's overdue rule covers that time (jobs/loop.py).
The embedded SQLite database has one server process: it is the only replica.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading

from sqlalchemy import Connection, Engine, text

log = logging.getLogger(__name__)

# "SMON" as a 32-bit number: the advisory lock class (first key) of replica membership locks.
REPLICA_LOCK_CLASS = 0x534D4F4E
_KEYS = (1, 2**31 - 1)


class Membership:
    """This replica's place in the set of live replicas."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.key = 0  # this replica's key once it has joined
        self._connection: Connection | None = None
        self._lock = threading.Lock()

    @property
    def shared(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def live(self) -> list[int]:
        """The keys of the live replicas, this one's included (joined first if it is not, or no
        longer, a member), in ascending order."""
        if not self.shared:
            return [self.key]
        with self._lock:
            for _ in range(2):
                found = self._listed()
                if self.key in found:
                    return found
                self._drop()  # the lock went with a connection PostgreSQL closed: join again
            raise RuntimeError("this replica's membership lock is not listed in pg_locks")

    def _listed(self) -> list[int]:
        """The membership locks listed, on the kept connection; one that broke while it was kept
        (the database restarted or was cut off since the last pass) is replaced once, so the
        first pass after an outage does not fail, and report a second outage, for a stale
        connection."""
        for fresh in (self._connection is None, True):
            try:
                if self._connection is None:
                    self._join()
                assert self._connection is not None
                keys = self._connection.execute(
                    text(
                        # Advisory locks are per database: another SMon's database on the same
                        # PostgreSQL server has replicas of its own.
                        "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
                        "AND classid = :cls AND objsubid = 2 AND granted AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())"
                    ),
                    {"cls": REPLICA_LOCK_CLASS},
                ).scalars()
                found = sorted({int(k) for k in keys})
                self._connection.commit()
                return found
            except Exception:
                self._drop()
                if fresh:
                    raise
        raise AssertionError("unreachable")

    def _join(self) -> None:
        connection = self.engine.connect()
        try:
            while True:
                key = random.randint(*_KEYS)
                got = connection.execute(
                    text("SELECT pg_try_advisory_lock(:cls, :key)"),
                    {"cls": REPLICA_LOCK_CLASS, "key": key},
                ).scalar()
                connection.commit()  # the lock is the session's: it outlives this transaction
                if got:
                    break
        except Exception:
            connection.invalidate()
            raise
        # Joined again after an outage cut its connection: the outage has its own two lines.
        log.log(logging.DEBUG if self.key else logging.INFO, "analysis replica %d joined", key)
        self._connection, self.key = connection, key

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            # Never back to the pool with the lock still held (a broken one may fail to close too).
            with contextlib.suppress(Exception):
                connection.invalidate()

    def leave(self) -> None:
        """Out of the set now (a server shutting down): its jobs go to the others at their next
        pass. Unlocked before the connection closes, so no one reads a session still ending."""
        with self._lock:
            if self._connection is not None:
                try:
                    self._connection.execute(
                        text("SELECT pg_advisory_unlock(:cls, :key)"),
                        {"cls": REPLICA_LOCK_CLASS, "key": self.key},
                    )
                    self._connection.commit()
                except Exception:  # closing the connection below releases it all the same
                    log.debug("replica lock release failed", exc_info=True)
            self._drop()
