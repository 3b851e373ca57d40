"""A fresh PostgreSQL database per benchmark run, dropped afterwards (SMON_BENCH_DATABASE_URL
names the server, default the test server on 127.0.0.1:5432)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support.databases
from smon_server.settings import Settings
from tests.support.databases import fresh_database as _fresh
from tests.support.settings import server_settings

ADMIN_URL = os.environ.get("SMON_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """The URL of a new, empty database on the benchmark server."""
    with _fresh(ADMIN_URL, prefix) as url:
        yield url


def loopback_settings(database_url: str, **overrides: object) -> Settings:
    """The tests' loopback server (ports of the OS's choosing), with analysis passes run only
    when the benchmark says so and analyses in worker processes, as `smon server` runs them."""
    return server_settings(database_url, **{"analysis_interval": 3600, "analysis_workers": None, **overrides})
