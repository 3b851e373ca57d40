"""phase_columns: each metric's rank × step heatmap as float32 per (job, metric, step), written by
the analysis pass, so a phase heatmap of a 4,096-rank job reads its rows instead of decoding the
whole window of raw step records

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "phase_columns",
        sa.Column("job_key", sa.Integer(), nullable=False),
        sa.Column("metric", sa.SmallInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("present", sa.LargeBinary(), nullable=True),
        sa.Column("seconds", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("job_key", "metric", "step"),
    )
    if op.get_bind().dialect.name == "postgresql":
        # Out of line and uncompressed: float32 seconds barely compress, and a rank zoom's
        # substring() then reads only the TOAST chunks it needs.
        op.execute("ALTER TABLE phase_columns ALTER COLUMN seconds SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("phase_columns")
