"""Shared fixtures: real databases (SQLite file, PostgreSQL), a real server on loopback ports."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from smon_server.runtime import BackgroundServer
from smon_server.settings import Settings
from smon_server.store import migrate
from smon_server.store.db import Database
from tests.databases import fresh_database

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
IN_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip loudly on a developer machine; under CI=true a missing dependency is a failure."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: required)")
    pytest.skip(reason)


def shared_dir() -> Path:
    return Path(os.environ.get("SMON_SHARED_DIR", REPO_ROOT.parent / "shared"))


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
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test using this runs twice: on the embedded SQLite default and on PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database)
    try:
        yield database
    finally:
        database.dispose()


def server_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "grpc_host": "127.0.0.1",
        "grpc_port": 0,
        "analysis_interval": 0.5,
        # In the server process: timing tests stay quick. The end-to-end jobs and
        # tests/jobs/test_workers.py run analyses in worker processes, as a server does by default.
        "analysis_workers": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def server(database_url: str) -> Iterator[BackgroundServer]:
    with BackgroundServer(server_settings(database_url)) as running:
        yield running
