"""analysis_results in the shapes the API serves: scalar columns for lists, one column per view

Before, one JSON `result` held everything, and `/jobs` decoded each job's whole result (17.8 MB
for a 4,096-rank job) to read its state. The heatmap moves to compact float32 bytes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
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

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MAGIC = b"SMG1"  # the layout of smon_server.store.grids, frozen here as migrations must be


def _pack(grid: dict[str, Any]) -> bytes:
    ranks = np.asarray(grid.get("ranks") or [], dtype="<i8")
    steps = np.asarray(grid.get("steps") or [], dtype="<i8")
    values = np.full((ranks.size, steps.size), np.nan, dtype="<f4")
    for i, row in enumerate(grid.get("values") or []):
        values[i, : len(row)] = [math.nan if v is None else float(v) for v in row]
    header = np.array([ranks.size, steps.size], dtype="<i8").tobytes()
    return _MAGIC + header + ranks.tobytes() + steps.tobytes() + values.tobytes()


def _load(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def _step_seconds(summary: dict[str, Any]) -> float | None:
    ideal, slowdown = summary.get("ideal_step_time"), summary.get("slowdown")
    return float(ideal) * float(slowdown) if ideal is not None and slowdown is not None else None


def upgrade() -> None:
    with op.batch_alter_table("analysis_results") as batch:
        batch.add_column(sa.Column("state", sa.String(length=16), nullable=False, server_default=""))
        batch.add_column(sa.Column("window_start", sa.Double(), nullable=True))
        batch.add_column(sa.Column("window_end", sa.Double(), nullable=True))
        batch.add_column(sa.Column("stragglers", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("worst_rank", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("leading_cause", sa.String(length=32), nullable=False, server_default=""))
        batch.add_column(sa.Column("step_seconds", sa.Double(), nullable=True))
        batch.add_column(sa.Column("top_workers", JSON_TYPE, nullable=True))
        batch.add_column(sa.Column("summary", JSON_TYPE, nullable=True))
        batch.add_column(sa.Column("steps", JSON_TYPE, nullable=True))
        batch.add_column(sa.Column("workers", JSON_TYPE, nullable=True))
        batch.add_column(sa.Column("rank_overall", JSON_TYPE, nullable=True))
        batch.add_column(sa.Column("heatmap", sa.LargeBinary(), nullable=True))

    table = sa.table(
        "analysis_results",
        sa.column("job_id", sa.String),
        sa.column("result", JSON_TYPE),
        sa.column("state", sa.String),
        sa.column("window_start", sa.Double),
        sa.column("window_end", sa.Double),
        sa.column("stragglers", sa.Integer),
        sa.column("worst_rank", sa.Integer),
        sa.column("leading_cause", sa.String),
        sa.column("step_seconds", sa.Double),
        sa.column("top_workers", JSON_TYPE),
        sa.column("summary", JSON_TYPE),
        sa.column("steps", JSON_TYPE),
        sa.column("workers", JSON_TYPE),
        sa.column("rank_overall", JSON_TYPE),
        sa.column("heatmap", sa.LargeBinary),
    )
    bind = op.get_bind()
    for job_id, result in bind.execute(sa.select(table.c.job_id, table.c.result)).all():
        result = _load(result)
        summary = result.get("summary") or {}
        stragglers = summary.get("stragglers") or []
        diagnoses = summary.get("diagnoses") or []
        bind.execute(
            table.update()
            .where(table.c.job_id == job_id)
            .values(
                state=str(result.get("state") or "")[:16],
                window_start=result.get("window_start"),
                window_end=result.get("window_end"),
                stragglers=len(stragglers),
                worst_rank=stragglers[0].get("rank") if stragglers else None,
                leading_cause=str(diagnoses[0].get("cause") or "")[:32] if diagnoses else "",
                step_seconds=_step_seconds(summary),
                top_workers=[],  # filled by the job's next analysis
                summary=summary,
                steps=result.get("steps") or [],
                workers=result.get("workers") or {},
                rank_overall=result.get("rank_overall") or {},
                heatmap=_pack(result.get("rank_slowdown") or {}),
            )
        )
    with op.batch_alter_table("analysis_results") as batch:
        batch.drop_column("result")


def downgrade() -> None:
    with op.batch_alter_table("analysis_results") as batch:
        batch.add_column(sa.Column("result", JSON_TYPE, nullable=True))
    table = sa.table(
        "analysis_results",
        sa.column("job_id", sa.String),
        sa.column("result", JSON_TYPE),
        sa.column("state", sa.String),
        sa.column("computed_at", sa.Double),
        sa.column("window_start", sa.Double),
        sa.column("window_end", sa.Double),
        sa.column("summary", JSON_TYPE),
        sa.column("steps", JSON_TYPE),
        sa.column("workers", JSON_TYPE),
        sa.column("rank_overall", JSON_TYPE),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(
            table.c.job_id,
            table.c.state,
            table.c.computed_at,
            table.c.window_start,
            table.c.window_end,
            table.c.summary,
            table.c.steps,
            table.c.workers,
            table.c.rank_overall,
        )
    ).all()
    for job_id, state, computed_at, start, end, summary, steps, workers, overall in rows:
        result = {
            "state": state,
            "computed_at": computed_at,
            "window_start": start,
            "window_end": end,
            "summary": summary or {},
            "steps": steps or [],
            "workers": workers or {},
            "rank_overall": overall or {},
            "rank_slowdown": {"ranks": [], "steps": [], "values": []},  # recomputed by the next pass
        }
        bind.execute(table.update().where(table.c.job_id == job_id).values(result=result))
    with op.batch_alter_table("analysis_results") as batch:
        for column in (
            "top_workers",
            "step_seconds",
            "heatmap",
            "rank_overall",
            "workers",
            "steps",
            "summary",
            "leading_cause",
            "worst_rank",
            "stragglers",
            "window_end",
            "window_start",
            "state",
        ):
            batch.drop_column(column)
