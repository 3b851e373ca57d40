"""device-timed step records keep their spans' host views (when the host issued each phase and
for how long), so the analysis can replay a host-bound GPU step on the host's time line

A nullable bytea on step_records: NULL for every existing row and for host-timed records (CPU
jobs), so nothing is rewritten and they store no more than before.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("step_records", sa.Column("span_host", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column("step_records", "span_host")
