"""ingested_batches.digest: a digest of each stored batch's records, so a batch resent under a
seq already stored with other records is refused instead of acked as a duplicate

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ingested_batches") as batch:
        batch.add_column(sa.Column("digest", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ingested_batches") as batch:
        batch.drop_column("digest")
