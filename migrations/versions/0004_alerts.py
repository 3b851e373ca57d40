"""alerts, silences and the notification outbox: the incident lifecycle and every send stored, so
they survive restarts and replicas share them

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
    op.create_table(
        "notifications",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.Column("notifier", sa.String(length=32), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("payload", JSON_TYPE, nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Double(), nullable=False),
        sa.Column("sent_at", sa.Double(), nullable=True),
        sa.Column("last_error", sa.String(length=1024), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("notifications") as batch:
        batch.create_index("ix_notifications_due", ["sent_at", "next_attempt_at"], unique=False)
    op.create_table(
        "alert_counters",
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("changed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "name"),
    )


def downgrade() -> None:
    op.drop_table("alert_counters")
    with op.batch_alter_table("notifications") as batch:
        batch.drop_index("ix_notifications_due")
    op.drop_table("notifications")
    op.drop_table("silences")
    with op.batch_alter_table("alerts") as batch:
        batch.drop_index("ix_alerts_job_state")
    op.drop_table("alerts")
