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


# The columns 0003 adds, in order: (name, type, NOT NULL server default or None).
NEW_COLUMNS: list[tuple[str, Any, str | None]] = [
    ("state", sa.String(length=16), ""),
    ("window_start", sa.Double(), None),
    ("window_end", sa.Double(), None),
    ("stragglers", sa.Integer(), "0"),
    ("worst_rank", sa.Integer(), None),
    ("leading_cause", sa.String(length=32), ""),
    ("flagged", sa.Boolean(), "0"),
    ("recent_slowdown", sa.Double(), None),
    ("recent_stragglers", JSON_TYPE, None),
    ("step_seconds", sa.Double(), None),
    ("top_workers", JSON_TYPE, None),
    ("summary", JSON_TYPE, None),
    ("steps", JSON_TYPE, None),
    ("workers", JSON_TYPE, None),
    ("rank_overall", JSON_TYPE, None),
    ("heatmap", sa.LargeBinary(), None),
]


def _results_table() -> sa.TableClause:
    return sa.table(
        "analysis_results",
        sa.column("job_id", sa.String),
        sa.column("computed_at", sa.Double),
        sa.column("result", JSON_TYPE),
        *(sa.column(name, kind) for name, kind, _ in NEW_COLUMNS),
    )


def _load(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def _step_seconds(summary: dict[str, Any]) -> float | None:
    ideal, slowdown = summary.get("ideal_step_time"), summary.get("slowdown")
    return float(ideal) * float(slowdown) if ideal is not None and slowdown is not None else None


def upgrade() -> None:
    with op.batch_alter_table("analysis_results") as batch:
        for name, kind, default in NEW_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=default is None, server_default=default))
    table = _results_table()
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
                flagged=bool(summary.get("discrepancy_flagged")),
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
    table = _results_table()
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
        batch.alter_column("result", existing_type=JSON_TYPE, nullable=False)
        for column, _, _ in reversed(NEW_COLUMNS):
            batch.drop_column(column)
