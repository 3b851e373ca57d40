"""Shared fixtures: real databases (SQLite file, PostgreSQL), a real server on loopback ports."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from smon_server.runtime import BackgroundServer
from smon_server.settings import Settings
from smon_server.store import migrate
from smon_server.store.db import Database
from tests.support.databases import fresh_database
from tests.support.paths import IN_CI, REPO_ROOT, shared_dir, skip_or_fail
from tests.support.settings import server_settings

__all__ = ["IN_CI", "REPO_ROOT", "server_settings", "shared_dir", "skip_or_fail"]

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    url = Settings(database_url=os.environ.get("SMON_TEST_DATABASE_URL", DEFAULT_PG)).database_url
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        skip_or_fail(f"PostgreSQL at {make_url(url).render_as_string()} is not reachable: {exc}")
    finally:
        engine.dispose()
    return url


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    with fresh_database(postgres_admin_url, "smon_test") as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'smon.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs twice: on the embedded SQLite default and on PostgreSQL; the
    database is empty (for tests of the migrations themselves)."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


# Migrated databases are copies of one migrated once per test process: the migrations cost
# ~0.3 s (SQLite) to ~0.5 s (PostgreSQL) a database, a copy ~0.1 s, and some 300 tests take one.
@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "smon.db"
    database = Database(f"sqlite:///{path}")
    try:
        migrate.upgrade(database)
    finally:
        database.dispose()
    return path


@pytest.fixture(scope="session")
def migrated_postgres_template(postgres_admin_url: str) -> Iterator[str]:
    with fresh_database(postgres_admin_url, "smon_template") as url:
        database = Database(url)
        try:
            migrate.upgrade(database)
        finally:
            database.dispose()  # CREATE DATABASE ... TEMPLATE needs it unconnected
        yield str(make_url(url).database)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each test using this runs twice: on the embedded SQLite default and on PostgreSQL, in a
    fresh database migrated to head (as a server leaves it at its start)."""
    if request.param == "sqlite":
        path = tmp_path / "smon.db"
        source = sqlite3.connect(request.getfixturevalue("migrated_sqlite_template"))
        copy = sqlite3.connect(path)
        try:
            source.backup(copy)
        finally:
            source.close()
            copy.close()
        yield f"sqlite:///{path}"
        return
    admin = request.getfixturevalue("postgres_admin_url")
    template = request.getfixturevalue("migrated_postgres_template")
    with fresh_database(admin, "smon_test", template=template) as url:
        yield url


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)  # migrated already (database_url)
    try:
        yield database
    finally:
        database.dispose()


@pytest.fixture
def server(database_url: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(server_settings(database_url)) as running:
        yield running
