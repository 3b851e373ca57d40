"""The dedup ledger (`ingested_batches`: one row per stored batch, keyed by (agent_id, seq)) kept
to a bounded size.

An agent resends a batch only while it keeps it unacked: after a reconnect, seconds to minutes
after it first sent it (smon/shipper.py). A ledger row is therefore only needed for a while, yet
at one batch a second per rank it costs about as much as the steps it vouches for and, never
deleted, it outlived retention. Rows older than SMON_INGEST_LEDGER_SECONDS (default an hour) are
deleted by the hourly storage maintenance, and each agent's highest deleted seq is kept as its
floor (`ingested_floors`, one row per agent): a batch at or below its agent's floor is
acknowledged as a duplicate and nothing of it is stored, so even a resend later than the ledger
keeps rows is stored once. (Batches of one agent are sent in seq order and an agent resends its
unacked ones, oldest first, on every reconnect: a batch below a pruned one that was never stored
would have had to stay unacked for the whole hour while the agent's later batches were stored.)
Floors go with retention: an agent silent for SMON_RETENTION_DAYS has nothing left to resend.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import case, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from smon_server.store.models import IngestedBatch, IngestedFloor

DEFAULT_LEDGER_SECONDS = 3600.0


def prune(session: Session, *, now: float, keep_seconds: float, floor_seconds: float | None = None) -> int:
    """Delete ledger rows received more than `keep_seconds` ago, raising their agents' floors to
    the highest seq deleted; floors untouched for `floor_seconds` go too. Returns rows deleted."""
    cutoff = now - keep_seconds
    highest = session.execute(
        select(IngestedBatch.agent_id, func.max(IngestedBatch.seq))
        .where(IngestedBatch.received_at < cutoff)
        .group_by(IngestedBatch.agent_id)
    ).all()
    if not highest:
        deleted = 0
    else:
        table: Any = IngestedFloor.__table__
        dialect: Any = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        insert = dialect.insert(table)
        raised = case((insert.excluded.seq > table.c.seq, insert.excluded.seq), else_=table.c.seq)
        session.execute(
            insert.on_conflict_do_update(
                index_elements=[table.c.agent_id], set_={"seq": raised, "pruned_at": now}
            ),
            [{"agent_id": a, "seq": int(q), "pruned_at": now} for a, q in highest],
        )
        result = session.execute(delete(IngestedBatch).where(IngestedBatch.received_at < cutoff))
        deleted = int(getattr(result, "rowcount", 0) or 0)
    if floor_seconds is not None and floor_seconds > 0:
        session.execute(delete(IngestedFloor).where(IngestedFloor.pruned_at < now - floor_seconds))
    return deleted


def below_floor(session: Session, keys: list[tuple[str, int]]) -> set[tuple[str, int]]:
    """Of these (agent_id, seq), those at or below their agent's floor (SQLite's claim path;
    PostgreSQL checks the floor inside the claim statement)."""
    if not keys:
        return set()
    floors = dict(
        session.execute(
            select(IngestedFloor.agent_id, IngestedFloor.seq).where(
                IngestedFloor.agent_id.in_({a for a, _ in keys})
            )
        ).all()
    )
    return {(a, q) for a, q in keys if a in floors and q <= floors[a]}
