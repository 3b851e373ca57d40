"""hosts: the fleet view's tables: which job attempts ran on each host, the stragglers charged
to their own hosts (incidents), the GPU health events derived from NVML samples, and each host's
figures over the default period, all kept after raw step records are dropped by retention

Nothing is backfilled: hosts fill in as jobs are analysed after the upgrade (docs/hosts.md).

Revision ID: 0011_hosts
Revises: 0011 (span_host)
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0011_hosts"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "host_jobs",
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("attempt", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ranks", sa.Integer(), nullable=False),
        sa.Column("gpus", JSON_TYPE, nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("gpu_scanned_until", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("host", "job_id", "attempt"),
    )
    op.create_index("ix_host_jobs_last_seen", "host_jobs", ["last_seen"])
    op.create_table(
        "host_incidents",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("dp_rank", sa.Integer(), nullable=True),
        sa.Column("stage", sa.Integer(), nullable=True),
        sa.Column("cause", sa.String(length=32), nullable=False),
        sa.Column("slowdown", sa.Double(), nullable=False),
        sa.Column("job_slowdown", sa.Double(), nullable=True),
        sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
        sa.Column("evidence", JSON_TYPE, nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", "rank", name="uq_host_incidents_rank"),
    )
    op.create_index("ix_host_incidents_host_last_seen", "host_incidents", ["host", "last_seen"])
    op.create_index("ix_host_incidents_last_seen", "host_incidents", ["last_seen"])
    op.create_table(
        "host_gpu_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("code", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_host_gpu_events_host_time", "host_gpu_events", ["host", "time"])
    op.create_index("ix_host_gpu_events_time", "host_gpu_events", ["time"])
    op.create_table(
        "host_summaries",
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("straggler_jobs", sa.Integer(), nullable=False),
        sa.Column("gpu_hours_lost", sa.Double(), nullable=False),
        sa.Column("gpu_faults", sa.Integer(), nullable=False),
        sa.Column("throttle_seconds", sa.Double(), nullable=False),
        sa.Column("last_incident", sa.Double(), nullable=True),
        sa.Column("suspect", sa.Boolean(), nullable=False),
        sa.Column("suspect_jobs", sa.Integer(), nullable=False),
        sa.Column("causes", JSON_TYPE, nullable=False),
        sa.Column("gpu_events", JSON_TYPE, nullable=False),
        sa.Column("incidents_by_day", JSON_TYPE, nullable=False),
        sa.Column("row_json", sa.Text(), nullable=False),
        sa.Column("refreshed_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("host"),
    )
    op.create_index(
        "ix_host_summaries_order",
        "host_summaries",
        ["suspect", "straggler_jobs", "gpu_hours_lost", "host", "last_seen"],
    )


def downgrade() -> None:
    op.drop_index("ix_host_summaries_order", table_name="host_summaries")
    op.drop_table("host_summaries")
    op.drop_index("ix_host_gpu_events_time", table_name="host_gpu_events")
    op.drop_index("ix_host_gpu_events_host_time", table_name="host_gpu_events")
    op.drop_table("host_gpu_events")
    op.drop_index("ix_host_incidents_last_seen", table_name="host_incidents")
    op.drop_index("ix_host_incidents_host_last_seen", table_name="host_incidents")
    op.drop_table("host_incidents")
    op.drop_index("ix_host_jobs_last_seen", table_name="host_jobs")
    op.drop_table("host_jobs")
