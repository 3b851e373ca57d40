"""The per-step series (`analysis_results.steps`) as packed little-endian columns instead of JSON
rows: a 500-step series was 78 kB of JSON, encoded and TOAST-compressed on every pass of every
job; packed it is 32 bytes a step (smon_server/store/step_series.py). Stored series are converted
in both directions.

Revision ID: 0014_step_series
Revises: 0013_step_writes
Create Date: 2026-11-29
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014_step_series"
down_revision: str | None = "0013_step_writes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
_MAGIC = b"SMS1"  # the layout of smon_server.store.step_series, frozen here as migrations must be
_VALUES = ("step_time", "ideal_time", "slowdown")


def _pack(rows: Any) -> bytes:
    rows = [r for r in rows or [] if isinstance(r, dict) and r.get("step") is not None]
    steps = np.array([int(r["step"]) for r in rows], dtype="<i8")
    columns = [
        np.array([math.nan if r.get(k) is None else float(r[k]) for r in rows], dtype="<f8") for k in _VALUES
    ]
    return b"".join(
        (
            _MAGIC,
            np.array([steps.size], dtype="<i8").tobytes(),
            steps.tobytes(),
            *(c.tobytes() for c in columns),
        )
    )


def _unpack(blob: bytes | None) -> list[dict[str, Any]]:
    if not blob or bytes(blob[:4]) != _MAGIC:
        return []
    n = int(np.frombuffer(blob, dtype="<i8", count=1, offset=4)[0])
    steps = np.frombuffer(blob, dtype="<i8", count=n, offset=12).tolist()
    columns = [np.frombuffer(blob, dtype="<f8", count=n, offset=12 + 8 * n * (k + 1)) for k in range(3)]
    return [
        {
            "step": step,
            **{k: None if math.isnan(c[i]) else float(c[i]) for k, c in zip(_VALUES, columns, strict=True)},
        }
        for i, step in enumerate(steps)
    ]


def _convert(old_type: Any, new_type: Any, convert: Any) -> None:
    """`steps` rewritten through `convert` into a column of `new_type` that takes its name."""
    with op.batch_alter_table("analysis_results") as batch:
        batch.add_column(sa.Column("steps_new", new_type, nullable=True))
    table = sa.table(
        "analysis_results",
        sa.column("job_id", sa.String),
        sa.column("attempt", sa.Integer),
        sa.column("steps", old_type),
        sa.column("steps_new", new_type),
    )
    bind = op.get_bind()
    for job_id, attempt, value in bind.execute(
        sa.select(table.c.job_id, table.c.attempt, table.c.steps)
    ).all():
        if isinstance(value, str):  # JSON text (SQLite) rather than decoded jsonb
            value = json.loads(value)
        bind.execute(
            table.update()
            .where(table.c.job_id == job_id, table.c.attempt == attempt)
            .values(steps_new=convert(value))
        )
    with op.batch_alter_table("analysis_results") as batch:
        batch.drop_column("steps")
        batch.alter_column("steps_new", new_column_name="steps")


def upgrade() -> None:
    _convert(JSON_TYPE, sa.LargeBinary(), _pack)


def downgrade() -> None:
    _convert(sa.LargeBinary(), JSON_TYPE, _unpack)
