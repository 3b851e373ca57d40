"""The dedup ledger pruned: `ingested_batches` rows older than SMON_INGEST_LEDGER_SECONDS are
deleted, and each agent's highest pruned seq is kept in `ingested_floors`, so a late resend of a
pruned batch is still recognised and stored once (store/ledger.py). An index on
`ingested_batches.received_at` finds the rows to prune without reading the whole ledger.

Revision ID: 0012_fleet
Revises: 0011_hosts (written on 0010_job_span_kinds, re-chained after main gained 0011 and 0011_hosts)
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_fleet"
down_revision: str | None = "0011_hosts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ingested_floors",
        sa.Column("agent_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("pruned_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_ingested_batches_received_at", "ingested_batches", ["received_at"])


def downgrade() -> None:
    # The floors' batches have no ledger rows any more: a resend of one would be stored again
    # (its step records still only once, by their key), so nothing of this is worth moving back.
    op.drop_index("ix_ingested_batches_received_at", table_name="ingested_batches")
    op.drop_table("ingested_floors")
