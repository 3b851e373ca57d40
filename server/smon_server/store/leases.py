"""Transaction-scoped leases shared by replicas: PostgreSQL advisory locks keyed by a name.

The analysis loop leases one job at a time; the alert engine leases its whole evaluation. The
embedded SQLite database has one server process and needs none (every lease is granted).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


def try_lease(session: Session, name: str, *, wait: bool = False) -> bool:
    """The lease on `name` for this transaction; `wait` blocks until its holder commits."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    call = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    got = session.execute(text(f"SELECT {call}(hashtextextended(:name, 0))::text"), {"name": name}).scalar()
    return wait or got == "true"
