"""compact step records: integer job / agent keys, span kinds as codes, spans packed in bytes,
phases derived; on PostgreSQL partitioned by day of start_time

Before, a step record took 1,251 bytes, 72 % of it two JSONB blobs, with the job id text and the
rank's coordinates repeated in every row (docs/storage.md).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The layouts of smon_server.store.codec, frozen here as migrations must be.
SPAN = np.dtype(
    [("kind", "<u2"), ("microbatch", "<i2"), ("chunk", "<u2"), ("start", "<f4"), ("duration", "<f4")]
)
SEQ_TOTAL = np.dtype([("count", "<u4"), ("max_len", "<u4"), ("tokens", "<u8"), ("sum_sq", "<f8")])
SEQ_MICROBATCH = np.dtype(
    [("microbatch", "<i4"), ("count", "<u4"), ("max_len", "<u4"), ("tokens", "<u8"), ("sum_sq", "<f8")]
)
PHASE_ORDER = ("data_wait", "h2d", "forward", "backward", "grad_sync", "optimizer", "checkpoint")
CHUNK = 5_000


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _add_key(table: str) -> None:
    """An integer key per row, numbered in insertion order; new rows get theirs from an identity
    column (PostgreSQL) or from store/writes.py (SQLite)."""
    if _postgres():
        op.add_column(table, sa.Column("key", sa.Integer(), sa.Identity(), nullable=False))
        op.create_unique_constraint(f"{table}_key_key", table, ["key"])
        return
    with op.batch_alter_table(table) as batch:
        batch.add_column(sa.Column("key", sa.Integer(), nullable=True))
    op.execute(f"UPDATE {table} SET key = rowid")
    with op.batch_alter_table(table) as batch:
        batch.alter_column("key", existing_type=sa.Integer(), nullable=False)
        batch.create_unique_constraint(f"{table}_key_key", ["key"])


def _load(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _new_table(name: str, *, partitioned: bool) -> None:
    options: dict[str, Any] = {"postgresql_partition_by": "RANGE (start_time)"} if partitioned else {}
    op.create_table(
        name,
        sa.Column("job_key", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("start_time", sa.Double(), nullable=False),
        sa.Column("duration", sa.REAL(), nullable=False),
        sa.Column("agent_key", sa.Integer(), nullable=False),
        sa.Column("gc_count", sa.SmallInteger(), nullable=False),
        sa.Column("gc_seconds", sa.REAL(), nullable=False),
        sa.Column("spans", sa.LargeBinary(), nullable=False),
        sa.Column("seq_total", sa.LargeBinary(), nullable=True),
        sa.Column("seq_microbatches", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("job_key", "step", "rank", "start_time"),
        **options,
    )


def _partitions_around(now: float) -> None:
    op.execute("CREATE TABLE step_records_default PARTITION OF step_records DEFAULT")
    today = datetime.fromtimestamp(now, tz=UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for offset in range(0, 3):
        day = today + timedelta(days=offset)
        lo, hi = day.timestamp(), (day + timedelta(days=1)).timestamp()
        name = f"step_records_p{day:%Y%m%d}"
        op.execute(f"CREATE TABLE {name} PARTITION OF step_records FOR VALUES FROM ({lo}) TO ({hi})")


def _spans_of(phases: dict[str, float], spans: list[Any]) -> list[tuple[str, float, float, int, int]]:
    if spans:
        return sorted(
            ((str(s[0]), float(s[1]), float(s[2]), int(s[3]), int(s[4])) for s in spans),
            key=lambda s: (s[1], -s[2]),
        )
    ordered = [p for p in PHASE_ORDER if p in phases]
    ordered += sorted(p for p in phases if p not in PHASE_ORDER and p not in ("gc", "other"))
    out, offset = [], 0.0
    for p in ordered:
        out.append((p, offset, float(phases[p]), -1, 0))
        offset += float(phases[p])
    return out


def upgrade() -> None:
    _add_key("jobs")
    _add_key("agents")
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("first_step", sa.BigInteger(), nullable=True))
    op.create_table(
        "span_kinds",
        sa.Column("code", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("code"),
        sa.UniqueConstraint("name"),
    )
    op.drop_index("ix_step_records_job_step", table_name="step_records")
    op.rename_table("step_records", "step_records_old")
    if _postgres():  # index names are per schema: the new table's key takes the old name
        op.execute("ALTER INDEX step_records_pkey RENAME TO step_records_old_pkey")
    _new_table("step_records", partitioned=_postgres())
    if _postgres():
        _partitions_around(time.time())
    bind = op.get_bind()
    bind.execute(
        sa.text(
            "UPDATE agents SET first_step = "
            "(SELECT min(o.step) FROM step_records_old o WHERE o.agent_id = agents.agent_id)"
        )
    )
    kinds: dict[str, int] = {}
    jobs: dict[str, int] = {j: k for j, k in bind.execute(sa.text("SELECT job_id, key FROM jobs"))}
    agents: dict[str, int] = {a: k for a, k in bind.execute(sa.text("SELECT agent_id, key FROM agents"))}
    # Streamed in chunks (a server-side cursor on PostgreSQL): a fleet's history does not fit in memory.
    old = bind.execute(
        sa.text(
            "SELECT job_id, rank, step, agent_id, start_time, duration, phases, spans, gc_count, "
            "gc_seconds, seq_count, seq_tokens, seq_sum_sq, seq_max_len, microbatch_seq "
            "FROM step_records_old"
        ).execution_options(stream_results=True, yield_per=CHUNK)
    )
    rows: list[dict[str, Any]] = []
    target = sa.table(
        "step_records",
        *(
            sa.column(c)
            for c in (
                "job_key",
                "step",
                "rank",
                "start_time",
                "duration",
                "agent_key",
                "gc_count",
                "gc_seconds",
                "spans",
                "seq_total",
                "seq_microbatches",
            )
        ),
    )
    for r in old.mappings():
        if r["job_id"] not in jobs or r["agent_id"] not in agents:
            continue  # a record without its job or agent row was never readable
        spans = _spans_of(_load(r["phases"]) or {}, _load(r["spans"]) or [])
        packed = np.empty(len(spans), dtype=SPAN)
        for i, (kind, start, duration, microbatch, chunk) in enumerate(spans):
            packed[i] = (kinds.setdefault(kind, len(kinds) + 1), microbatch, chunk, start, duration)
        mbs = _load(r["microbatch_seq"]) or []
        rows.append(
            {
                "job_key": jobs[r["job_id"]],
                "step": r["step"],
                "rank": r["rank"],
                "start_time": r["start_time"],
                "duration": r["duration"],
                "agent_key": agents[r["agent_id"]],
                "gc_count": min(int(r["gc_count"] or 0), 32_767),
                "gc_seconds": r["gc_seconds"] or 0.0,
                "spans": packed.tobytes(),
                "seq_total": np.array(
                    [(r["seq_count"], r["seq_max_len"], r["seq_tokens"], r["seq_sum_sq"])], dtype=SEQ_TOTAL
                ).tobytes()
                if r["seq_count"]
                else None,
                "seq_microbatches": np.array(
                    [(m[0], m[1], m[4], m[2], m[3]) for m in mbs], dtype=SEQ_MICROBATCH
                ).tobytes()
                if mbs
                else None,
            }
        )
        if len(rows) >= CHUNK:
            bind.execute(target.insert(), rows)
            rows = []
    if rows:
        bind.execute(target.insert(), rows)
    if kinds:
        bind.execute(
            sa.table("span_kinds", sa.column("code"), sa.column("name")).insert(),
            [{"code": code, "name": name} for name, code in kinds.items()],
        )
    op.drop_table("step_records_old")


def downgrade() -> None:
    op.rename_table("step_records", "step_records_new")
    if _postgres():
        op.execute("ALTER INDEX step_records_pkey RENAME TO step_records_new_pkey")
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
    op.create_index("ix_step_records_job_step", "step_records", ["job_id", "step"], unique=False)
    bind = op.get_bind()
    names: dict[int, str] = {c: n for c, n in bind.execute(sa.text("SELECT code, name FROM span_kinds"))}
    rows = bind.execute(
        sa.text(
            "SELECT j.job_id, a.agent_id, a.dp_rank, a.pp_rank, a.tp_rank, n.* FROM step_records_new n "
            "JOIN jobs j ON j.key = n.job_key JOIN agents a ON a.key = n.agent_key"
        )
    )
    target = sa.table(
        "step_records",
        *(
            sa.column(c, JSON_TYPE if c in ("phases", "spans", "microbatch_seq") else None)
            for c in (
                "job_id",
                "rank",
                "step",
                "agent_id",
                "dp_rank",
                "pp_rank",
                "tp_rank",
                "start_time",
                "end_time",
                "duration",
                "phases",
                "spans",
                "gc_count",
                "gc_seconds",
                "seq_count",
                "seq_tokens",
                "seq_sum_sq",
                "seq_max_len",
                "microbatch_seq",
                "received_at",
            )
        ),
    )
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for r in rows.mappings().all():
        spans = np.frombuffer(bytes(r["spans"]), dtype=SPAN)
        phases: dict[str, float] = {}
        for s in spans:
            phases[names[int(s["kind"])]] = phases.get(names[int(s["kind"])], 0.0) + float(s["duration"])
        total = np.frombuffer(bytes(r["seq_total"]), dtype=SEQ_TOTAL) if r["seq_total"] else None
        mbs: Any = (
            np.frombuffer(bytes(r["seq_microbatches"]), dtype=SEQ_MICROBATCH) if r["seq_microbatches"] else []
        )
        key = (r["job_id"], r["rank"], r["step"])
        if key in out and out[key]["start_time"] > r["start_time"]:
            continue  # the old key holds one record per step: keep the newest run
        out[key] = {
            "job_id": r["job_id"],
            "rank": r["rank"],
            "step": r["step"],
            "agent_id": r["agent_id"],
            "dp_rank": r["dp_rank"],
            "pp_rank": r["pp_rank"],
            "tp_rank": r["tp_rank"],
            "start_time": r["start_time"],
            "end_time": r["start_time"] + r["duration"],
            "duration": r["duration"],
            "phases": phases | ({"gc": r["gc_seconds"]} if r["gc_count"] else {}),
            "spans": [
                [
                    names[int(s["kind"])],
                    float(s["start"]),
                    float(s["duration"]),
                    int(s["microbatch"]),
                    int(s["chunk"]),
                ]
                for s in spans
            ],
            "gc_count": r["gc_count"],
            "gc_seconds": r["gc_seconds"],
            "seq_count": int(total[0]["count"]) if total is not None else 0,
            "seq_tokens": int(total[0]["tokens"]) if total is not None else 0,
            "seq_sum_sq": float(total[0]["sum_sq"]) if total is not None else 0.0,
            "seq_max_len": int(total[0]["max_len"]) if total is not None else 0,
            "microbatch_seq": [
                [
                    int(m["microbatch"]),
                    int(m["count"]),
                    int(m["tokens"]),
                    float(m["sum_sq"]),
                    int(m["max_len"]),
                ]
                for m in mbs
            ],
            "received_at": r["start_time"] + r["duration"],
        }
    if out:
        bind.execute(target.insert(), list(out.values()))
    op.drop_table("step_records_new")  # drops its partitions with it
    op.drop_table("span_kinds")
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("first_step")
    for table in ("agents", "jobs"):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"{table}_key_key", type_="unique")
            batch.drop_column("key")
