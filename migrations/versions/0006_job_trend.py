"""job_trend: a job's slowdown and step times per bucket of steps, kept after its raw step records
are dropped, so a long or finished job's history outlives the analysis window and retention

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_trend",
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("bucket", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=True),
        sa.Column("end_time", sa.Double(), nullable=True),
        sa.Column("step_times", sa.LargeBinary(), nullable=False),
        sa.Column("ideal_times", sa.LargeBinary(), nullable=False),
        sa.Column("stragglers", JSON_TYPE, nullable=False),
        sa.Column("leading_cause", sa.String(length=32), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "bucket"),
    )


def downgrade() -> None:
    op.drop_table("job_trend")
