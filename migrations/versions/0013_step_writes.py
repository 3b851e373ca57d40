"""A job attempt's news is counted, not timed: `jobs.step_writes` counts the ingest transactions
that stored its step records, and `analysis_results.step_writes_seen` the count a pass read
before reading any record. A pass has news when the count moved (jobs/refresh.py): comparing
`last_step_seen` with the pass's time missed a write stamped before a pass began and committed
after it read the records (a late rank's records of steps already seen were then left out
until the next new step).

Revision ID: 0013_step_writes
Revises: 0012_fleet
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_step_writes"
down_revision: str | None = "0012_fleet"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("step_writes", sa.BigInteger(), nullable=False, server_default="0"))
    # NULL: a result stored before the counter; its job's news is timed as before, once.
    op.add_column("analysis_results", sa.Column("step_writes_seen", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("analysis_results", "step_writes_seen")
    op.drop_column("jobs", "step_writes")
