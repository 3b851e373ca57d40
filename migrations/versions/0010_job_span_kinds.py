"""span kind names per job attempt: one job's names can no longer fill the dictionary every job
needs; jobs count the spans folded into `other` past their limit; analysis results say when the
latest pass failed

`span_kinds` (one dictionary for the whole server, at most 32,767 names, never expiring) becomes
`job_span_kinds` keyed by (job_key, code). Stored records keep their bytes: each job attempt's
dictionary gets the names of the codes its step records and phase columns use, under the same
codes. A downgrade makes one dictionary again, renumbering the names and rewriting the spans and
phase columns of every job whose codes differ from the new ones (it fails, changing nothing, if the
jobs hold more than 32,767 distinct names together).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SPAN_BYTES = 14  # store/codec.py SPAN: kind u2 | microbatch i2 | chunk u2 | start f4 | duration f4
MAX_CODE = 32_767
_CHUNK = 5_000


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    op.create_table(
        "job_span_kinds",
        sa.Column("job_key", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("code", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("job_key", "code"),
        sa.UniqueConstraint("job_key", "name", name="uq_job_span_kinds_name"),
    )
    bind = op.get_bind()
    if _postgres():
        # Every code a job's spans use (the kind is the first two bytes of each 14-byte span,
        # little-endian) or its phase columns are stored under.
        op.execute(
            "INSERT INTO job_span_kinds (job_key, code, name)"
            " SELECT u.job_key, u.code, k.name FROM ("
            "  SELECT DISTINCT r.job_key,"
            "   get_byte(r.spans, i * 14) + 256 * get_byte(r.spans, i * 14 + 1) AS code"
            "  FROM step_records r, generate_series(0, length(r.spans) / 14 - 1) AS i"
            "  UNION SELECT DISTINCT job_key, metric FROM phase_columns WHERE metric >= 0"
            " ) u JOIN span_kinds k ON k.code = u.code"
        )
    else:
        names: dict[int, str] = {
            int(c): str(n) for c, n in bind.execute(sa.text("SELECT code, name FROM span_kinds"))
        }
        used: set[tuple[int, int]] = set()
        for job_key, spans in bind.execute(sa.text("SELECT job_key, spans FROM step_records")):
            codes = np.frombuffer(bytes(spans or b""), dtype="<u2").reshape(-1, SPAN_BYTES // 2)[:, 0]
            used.update((int(job_key), int(c)) for c in np.unique(codes))
        used.update(
            (int(k), int(m))
            for k, m in bind.execute(
                sa.text("SELECT DISTINCT job_key, metric FROM phase_columns WHERE metric >= 0")
            )
        )
        rows = [{"job_key": k, "code": c, "name": names[c]} for k, c in sorted(used) if c in names]
        if rows:
            table = sa.table("job_span_kinds", sa.column("job_key"), sa.column("code"), sa.column("name"))
            op.bulk_insert(table, rows)
    op.drop_table("span_kinds")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("folded_spans", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("folded_example", sa.String(length=128), nullable=False, server_default="")
        )
    with op.batch_alter_table("analysis_results") as batch:
        batch.add_column(sa.Column("error", sa.String(length=512), nullable=False, server_default=""))
        batch.add_column(sa.Column("error_at", sa.Double(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT job_key, code, name FROM job_span_kinds ORDER BY code, name")).all()
    # One code per name: the lowest any job gave it, where no other name claims it first.
    glob: dict[str, int] = {}
    taken: set[int] = set()
    for _, code, name in rows:
        if name not in glob and int(code) not in taken:
            glob[name] = int(code)
            taken.add(int(code))
    free = (c for c in range(1, MAX_CODE + 1) if c not in taken)
    for _, _, name in rows:
        if name not in glob:
            code = next(free, None)
            if code is None:
                raise RuntimeError(f"jobs hold more than {MAX_CODE} distinct span kind names together")
            glob[name] = code
    remap: dict[int, dict[int, int]] = {}
    for job_key, code, name in rows:
        if glob[name] != int(code):
            remap.setdefault(int(job_key), {})[int(code)] = glob[name]
    for job_key, mapping in remap.items():
        _recode_job(bind, job_key, mapping)
    op.create_table(
        "span_kinds",
        sa.Column("code", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("code"),
        sa.UniqueConstraint("name"),
    )
    if glob:
        table = sa.table("span_kinds", sa.column("code"), sa.column("name"))
        op.bulk_insert(table, [{"code": c, "name": n} for n, c in glob.items()])
    op.drop_table("job_span_kinds")
    with op.batch_alter_table("analysis_results") as batch:
        batch.drop_column("error_at")
        batch.drop_column("error")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("folded_example")
        batch.drop_column("folded_spans")


def _recode_job(bind: sa.Connection, job_key: int, mapping: dict[int, int]) -> None:
    """The job's spans and phase columns with kind codes moved per `mapping` (old -> new)."""
    lookup = np.arange(65_536, dtype=np.uint16)
    for old, new in mapping.items():
        lookup[old] = new
    select = sa.text(
        "SELECT step, rank, start_time, spans FROM step_records WHERE job_key = :k"
        " AND (step, rank, start_time) > (:s, :r, :t) ORDER BY step, rank, start_time LIMIT :n"
    )
    update = sa.text(
        "UPDATE step_records SET spans = :spans"
        " WHERE job_key = :k AND step = :step AND rank = :rank AND start_time = :start"
    )
    after = (-(2**63), -(2**31), -1e300)
    while True:
        batch = bind.execute(
            select, {"k": job_key, "s": after[0], "r": after[1], "t": after[2], "n": _CHUNK}
        ).all()
        if not batch:
            break
        changes = []
        for step, rank, start, spans in batch:
            packed = np.frombuffer(bytes(spans or b""), dtype="<u2").reshape(-1, SPAN_BYTES // 2).copy()
            recoded = lookup[packed[:, 0]]
            if (recoded != packed[:, 0]).any():
                packed[:, 0] = recoded
                changes.append(
                    {"k": job_key, "step": step, "rank": rank, "start": start, "spans": packed.tobytes()}
                )
        if changes:
            bind.execute(update, changes)
        after = tuple(batch[-1][:3])
    # Phase columns: read out, deleted, written back under their new codes (codes may swap, and
    # a key update would collide on the way).
    columns = sa.text(
        "SELECT metric, step, present, seconds FROM phase_columns WHERE job_key = :k AND metric IN :m"
    )
    columns = columns.bindparams(sa.bindparam("m", expanding=True))
    moved = [
        {"job_key": job_key, "metric": mapping[int(m)], "step": s, "present": p, "seconds": v}
        for m, s, p, v in bind.execute(columns, {"k": job_key, "m": list(mapping)}).all()
    ]
    delete = sa.text("DELETE FROM phase_columns WHERE job_key = :k AND metric IN :m")
    bind.execute(delete.bindparams(sa.bindparam("m", expanding=True)), {"k": job_key, "m": list(mapping)})
    if moved:
        bind.execute(
            sa.text(
                "INSERT INTO phase_columns (job_key, metric, step, present, seconds)"
                " VALUES (:job_key, :metric, :step, :present, :seconds)"
            ),
            moved,
        )
