"""Alembic environment: the only way SMon's schema changes (`smon db upgrade`)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from smon_server.settings import Settings
from smon_server.store.db import make_engine
from smon_server.store.models import Base
from smon_server.store.partitions import alembic_include_name

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds tables instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=alembic_include_name,
    )


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or Settings().database_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or Settings().database_url
    engine = make_engine(url, answer_timeout=None)  # a migration may rewrite big tables
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
