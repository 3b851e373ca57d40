"""A fresh PostgreSQL database per benchmark run, dropped afterwards (SMON_BENCH_DATABASE_URL
names the server, default the test server on 127.0.0.1:5432)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ADMIN_URL = os.environ.get("SMON_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty database."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
