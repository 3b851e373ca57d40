"""Stored rows as tests and benchmarks build and measure them, apart from the server: production
packs spans from columns (store/codec.py `pack_span_columns`) and never sizes its own tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from sqlalchemy import text
from sqlalchemy.orm import Session

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store import codec
from smon_server.store.db import Database
from smon_server.store.partitions import PARENT
from smon_server.store.writes import write_batches


def pack_spans(spans: Sequence[codec.SpanTuple]) -> bytes:
    """One record's spans, (kind code, start, duration, micro-batch, chunk) each, as stored."""
    out = np.empty(len(spans), dtype=codec.SPAN)
    if spans:
        kind, start, duration, microbatch, chunk = zip(*spans, strict=True)
        out["kind"], out["start"], out["duration"] = kind, start, duration
        out["microbatch"], out["chunk"] = microbatch, chunk
    return out.tobytes()


def stored_bytes(session: Session) -> int:
    """Bytes on disk of step_records, every partition with its indexes (PostgreSQL)."""
    total = session.execute(
        text(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
            "WHERE p.relname = :parent"
        ),
        {"parent": PARENT},
    ).scalar()
    return int(total or 0)


def store_batches(db: Database, batches: Iterable[pb.Batch], *, now: float) -> None:
    """Agents' batches stored as ingest stores them (validated with the default limits), without
    a server: what a test of the analysis starts from."""
    write_batches(db, [validate_batch(b, Limits()) for b in batches], now=now)
