"""A fresh PostgreSQL database, dropped afterwards: for tests (conftest's `postgres_url`) and for
the benchmarks (benchmarks/bench_db.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


@contextmanager
def fresh_database(admin_url: str, prefix: str, template: str | None = None) -> Iterator[str]:
    """The URL of a new database on the server `admin_url` points at: empty, or a copy of the
    database named `template` (which nothing may be connected to)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        copy = f' TEMPLATE "{template}"' if template else ""
        connection.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
