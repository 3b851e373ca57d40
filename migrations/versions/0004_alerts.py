"""alerts and silences: incident lifecycle stored, so it survives restarts and replicas share it

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dedup_key", sa.String(length=400), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.String(length=1024), nullable=False),
        sa.Column("details", JSON_TYPE, nullable=True),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("fired_at", sa.Double(), nullable=True),
        sa.Column("last_true_at", sa.Double(), nullable=False),
        sa.Column("resolved_at", sa.Double(), nullable=True),
        sa.Column("acked_at", sa.Double(), nullable=True),
        sa.Column("acked_by", sa.String(length=256), nullable=False),
        sa.Column("silenced", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("alerts") as batch:
        batch.create_index("ix_alerts_job_state", ["job_id", "state"], unique=False)
    op.create_table(
        "silences",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("matchers", JSON_TYPE, nullable=False),
        sa.Column("starts_at", sa.Double(), nullable=False),
        sa.Column("ends_at", sa.Double(), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=False),
        sa.Column("comment", sa.String(length=1024), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("silences")
    with op.batch_alter_table("alerts") as batch:
        batch.drop_index("ix_alerts_job_state")
    op.drop_table("alerts")
