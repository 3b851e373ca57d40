"""Span kind names ↔ small integer codes (the span_kinds table), cached in the process.

A code is assigned once, in a short transaction of its own, the first time any replica sees the
name, and never changes, so a cached code stays right. Replicas adding names at once may pick the
same code: one insert wins, the other does nothing, and both read back the winner's codes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from smon_server.store.codec import MAX_KINDS
from smon_server.store.models import SpanKind

Transaction = Callable[[], AbstractContextManager[Session]]


class SpanKinds:
    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._lock = threading.Lock()

    def codes(self, transaction: Transaction, names: Iterable[str]) -> dict[str, int]:
        """Codes of `names`, adding new ones. A name left out has no code: the dictionary is
        full (MAX_KINDS), and the caller refuses the records that use it."""
        wanted = set(names)
        with self._lock:
            missing = sorted(wanted - self._codes.keys())
        if missing:
            self._add(transaction, missing)
        with self._lock:
            return {name: self._codes[name] for name in wanted if name in self._codes}

    def _add(self, transaction: Transaction, names: list[str]) -> None:
        found: dict[str, int] = {}
        for _ in range(10):
            with transaction() as session:
                rows = session.execute(select(SpanKind.name, SpanKind.code).where(SpanKind.name.in_(names)))
                found = {str(n): int(c) for n, c in rows}
                new = [n for n in names if n not in found]
                top = int(session.scalar(select(func.coalesce(func.max(SpanKind.code), 0))) or 0)
                new = new[: max(0, MAX_KINDS - top)]
                if not new:
                    break
                dialect = session.get_bind().dialect.name
                insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(SpanKind)
                values = [{"code": top + 1 + i, "name": name} for i, name in enumerate(new)]
                session.execute(insert.values(values).on_conflict_do_nothing())
        with self._lock:
            self._codes.update(found)


def kind_names(session: Session) -> tuple[str, ...]:
    """Every kind name at the index of its code ("" where no name has the code)."""
    rows = [(int(c), str(n)) for c, n in session.execute(select(SpanKind.code, SpanKind.name))]
    out = [""] * (max((c for c, _ in rows), default=0) + 1)
    for code, name in rows:
        out[code] = name
    return tuple(out)
