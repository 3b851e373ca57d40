"""Faster compression for the large values a pass rewrites every interval.

Each pass replaces a job's stored analysis (about 130 kB of S_w heatmap and 80 kB of JSON views
for 64 ranks × 500 steps). PostgreSQL compresses such values with pglz by default, which took
about 5 ms of the database's time per job and pass; lz4 (PostgreSQL 14+, when built with it)
takes about a fifth of that. The setting is the transaction's own (SET LOCAL), so ingest's step
records keep the server's default; either is read back alike.
"""

from __future__ import annotations

import threading

from sqlalchemy import text
from sqlalchemy.orm import Session

_supported: dict[str, bool] = {}
_guard = threading.Lock()


def prefer_lz4(session: Session) -> bool:
    """In this transaction, compress new large values with lz4 where the server offers it;
    returns whether it does."""
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    url = str(bind.engine.url)
    with _guard:
        known = _supported.get(url)
    if known is None:
        known = bool(
            session.scalar(
                text("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
            )
        )
        with _guard:
            _supported[url] = known
    if known:
        session.execute(text("SET LOCAL default_toast_compression = lz4"))
    return known
