"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# jsonb on PostgreSQL, JSON text on SQLite (as in smon_server.store.models).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("local_rank", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=256), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("dp_rank", sa.Integer(), nullable=False),
        sa.Column("pp_rank", sa.Integer(), nullable=False),
        sa.Column("tp_rank", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=False),
        sa.Column("clock_offset", sa.Double(), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("dropped_records", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("hb_time", sa.Double(), nullable=True),
        sa.Column("hb_last_step", sa.BigInteger(), nullable=True),
        sa.Column("hb_current_step", sa.BigInteger(), nullable=True),
        sa.Column("hb_phase", sa.String(length=128), nullable=False),
        sa.Column("hb_phase_since", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("agent_id"),
    )
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.create_index("ix_agents_job_rank", ["job_id", "rank"], unique=False)

    op.create_table(
        "analysis_results",
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("computed_at", sa.Double(), nullable=False),
        sa.Column("from_step", sa.BigInteger(), nullable=True),
        sa.Column("to_step", sa.BigInteger(), nullable=True),
        sa.Column("steps_seen", sa.Integer(), nullable=False),
        sa.Column("slowdown", sa.Double(), nullable=True),
        sa.Column("waste_fraction", sa.Double(), nullable=True),
        sa.Column("result", JSON_TYPE, nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "gpu_samples",
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("time", sa.Double(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=128), nullable=False),
        sa.Column("sm_clock_mhz", sa.Double(), nullable=True),
        sa.Column("sm_clock_max_mhz", sa.Double(), nullable=True),
        sa.Column("mem_clock_mhz", sa.Double(), nullable=True),
        sa.Column("mem_clock_max_mhz", sa.Double(), nullable=True),
        sa.Column("gpu_util", sa.Double(), nullable=True),
        sa.Column("mem_util", sa.Double(), nullable=True),
        sa.Column("mem_used_bytes", sa.Double(), nullable=True),
        sa.Column("mem_total_bytes", sa.Double(), nullable=True),
        sa.Column("temperature_c", sa.Double(), nullable=True),
        sa.Column("power_w", sa.Double(), nullable=True),
        sa.Column("power_limit_w", sa.Double(), nullable=True),
        sa.Column("throttle_reasons", sa.BigInteger(), nullable=True),
        sa.Column("ecc_corrected", sa.BigInteger(), nullable=True),
        sa.Column("ecc_uncorrected", sa.BigInteger(), nullable=True),
        sa.Column("pcie_replay", sa.BigInteger(), nullable=True),
        sa.Column("xid_events", JSON_TYPE, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "rank", "gpu_index", "time"),
    )
    op.create_table(
        "ingested_batches",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("rejected", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "seq"),
    )
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("dp_size", sa.Integer(), nullable=False),
        sa.Column("pp_size", sa.Integer(), nullable=False),
        sa.Column("tp_size", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("last_step_seen", sa.Double(), nullable=True),
        sa.Column("gpu_hours_wasted", sa.Double(), nullable=False),
        sa.Column("wasted_until", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "step_records",
        sa.Column("job_id", sa.String(length=256), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("dp_rank", sa.Integer(), nullable=False),
        sa.Column("pp_rank", sa.Integer(), nullable=False),
        sa.Column("tp_rank", sa.Integer(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("end_time", sa.Double(), nullable=False),
        sa.Column("duration", sa.Double(), nullable=False),
        sa.Column("phases", JSON_TYPE, nullable=False),
        sa.Column("spans", JSON_TYPE, nullable=False),
        sa.Column("gc_count", sa.Integer(), nullable=False),
        sa.Column("gc_seconds", sa.Double(), nullable=False),
        sa.Column("seq_count", sa.Integer(), nullable=False),
        sa.Column("seq_tokens", sa.BigInteger(), nullable=False),
        sa.Column("seq_sum_sq", sa.Double(), nullable=False),
        sa.Column("seq_max_len", sa.Integer(), nullable=False),
        sa.Column("microbatch_seq", JSON_TYPE, nullable=False),
        sa.Column("received_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "rank", "step"),
    )
    with op.batch_alter_table("step_records", schema=None) as batch_op:
        batch_op.create_index("ix_step_records_job_step", ["job_id", "step"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("step_records", schema=None) as batch_op:
        batch_op.drop_index("ix_step_records_job_step")

    op.drop_table("step_records")
    op.drop_table("jobs")
    op.drop_table("ingested_batches")
    op.drop_table("gpu_samples")
    op.drop_table("analysis_results")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_index("ix_agents_job_rank")

    op.drop_table("agents")
