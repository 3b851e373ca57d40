"""Run Alembic migrations from code (`smon db upgrade`, server start-up, tests)."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from smon_server.store.db import Database, answer_deadline

# Any constant works: it only has to be the same on every replica that might migrate at once.
_MIGRATION_LOCK_KEY = 0x534D4F4E  # "SMON"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("smon_server.migrations")))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate to `revision`. On PostgreSQL an advisory lock keeps replicas from racing. No
    statement bound: a migration may rewrite a big table, or wait for another replica's."""
    config = alembic_config(db.url)
    with answer_deadline(None), db.engine.begin() as connection:
        if db.is_postgres:
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(db: Database, revision: str) -> None:
    """Back to `revision` (an operator's way out of a bad upgrade; tests check it round-trips)."""
    config = alembic_config(db.url)
    with answer_deadline(None), db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current_revision(db: Database) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with db.engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
