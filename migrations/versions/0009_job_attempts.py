"""job attempts: a job restarted under the same id (torchrun elastic restart, a resubmission)
reports into a new attempt, a jobs row of its own with its own integer key, so its step records,
phase columns, analysis and trend are never mixed with the old run's

jobs are keyed by (job_id, attempt) and remember the attempt identity their agents reported;
agents, analysis_results and job_trend carry the attempt. What is stored already becomes
attempt 1. A downgrade keeps each job's newest attempt (the old schema has room for one) and
deletes the older attempts' rows, step records included.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, primary key before, primary key after); PostgreSQL named each key <table>_pkey.
KEYED = (
    ("jobs", ["job_id"], ["job_id", "attempt"]),
    ("analysis_results", ["job_id"], ["job_id", "attempt"]),
    ("job_trend", ["job_id", "bucket"], ["job_id", "attempt", "bucket"]),
)


def _older(table: str) -> str:
    """SQL: the row of `table` is of an attempt older than its job's newest."""
    return f"{table}.attempt < (SELECT max(j.attempt) FROM jobs j WHERE j.job_id = {table}.job_id)"


def _primary_key(table: str, new: list[str]) -> None:
    name = f"{table}_pkey"
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint(name, table, type_="primary")
        op.create_primary_key(name, table, new)
        return
    # SQLite rebuilds the table. Its key is read back unnamed: the convention names it, so it can
    # be dropped (which clears its columns' primary-key flags) before the new key is made.
    convention = {"pk": "%(table_name)s_pkey"}
    with op.batch_alter_table(table, recreate="always", naming_convention=convention) as batch:
        batch.drop_constraint(name, type_="primary")
        batch.create_primary_key(name, new)


def _add_attempt(table: str) -> None:
    """attempt = 1 for every stored row, then no server default (the models give the value)."""
    with op.batch_alter_table(table) as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table(table) as batch:
        batch.alter_column("attempt", existing_type=sa.Integer(), server_default=None)


def upgrade() -> None:
    for table, _, after in KEYED:
        _add_attempt(table)
        _primary_key(table, after)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("reported_attempt", sa.BigInteger(), nullable=True))
    _add_attempt("agents")
    op.drop_index("ix_agents_job_rank", table_name="agents")
    op.create_index("ix_agents_job_attempt_rank", "agents", ["job_id", "attempt", "rank"])


def downgrade() -> None:
    older_keys = f"SELECT key FROM jobs WHERE {_older('jobs')}"
    op.execute(f"DELETE FROM step_records WHERE job_key IN ({older_keys})")
    op.execute(f"DELETE FROM phase_columns WHERE job_key IN ({older_keys})")
    for table in ("analysis_results", "job_trend", "agents"):
        op.execute(f"DELETE FROM {table} WHERE {_older(table)}")
    op.execute(f"DELETE FROM jobs WHERE key IN ({older_keys})")
    op.drop_index("ix_agents_job_attempt_rank", table_name="agents")
    op.create_index("ix_agents_job_rank", "agents", ["job_id", "rank"])
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("attempt")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("reported_attempt")
    for table, before, _ in KEYED:
        _primary_key(table, before)
        with op.batch_alter_table(table) as batch:
            batch.drop_column("attempt")
