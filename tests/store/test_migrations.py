"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from smon_server.store import migrate
from smon_server.store.db import Database
from smon_server.store.models import Base


def test_upgrade_reaches_head_and_matches_models(db: Database) -> None:
    assert migrate.current_revision(db) is not None
    with db.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_upgrade_is_idempotent(db: Database) -> None:
    before = migrate.current_revision(db)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == before
