"""Time partitions of step_records on PostgreSQL, and retention on both databases.

One partition per UTC day (`step_records_pYYYYMMDD`), created a few days ahead by whichever
replica holds the maintenance lease, and dropped whole once it is older than
`SMON_RETENTION_DAYS`: dropping a table costs nothing, deleting millions of rows does. A default
partition catches records outside every day partition (an agent clock far off, a server that was
down for days); when a day's partition is created later, its rows move out of the default first
(PostgreSQL refuses to attach a range the default partition holds rows of). SQLite keeps one
table and deletes expired rows.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

PARENT = "step_records"
DEFAULT = "step_records_default"
_DAY = re.compile(r"^step_records_p(\d{8})$")
DAY_SECONDS = 86_400


def is_partition(name: str | None) -> bool:
    """A partition of step_records (Alembic's autogenerate must not see them as stray tables)."""
    return bool(name) and (name == DEFAULT or bool(_DAY.match(str(name))))


def alembic_include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's `include_name`: day partitions are made at run time, not by the models."""
    return not (type_ == "table" and is_partition(name))


def day_name(day: datetime) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def day_start(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def existing_days(session: Session) -> dict[str, datetime]:
    rows = session.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :parent"
        ),
        {"parent": PARENT},
    ).scalars()
    out = {}
    for name in rows:
        match = _DAY.match(name)
        if match:
            out[name] = datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)
    return out


def ensure_partitions(session: Session, *, now: float, days_ahead: int = 2, days_back: int = 0) -> list[str]:
    """Create the day partitions from `days_back` days ago to `days_ahead` days from now that do
    not exist yet; returns their names. PostgreSQL only."""
    have = existing_days(session)
    created = []
    today = day_start(now)
    for offset in range(-days_back, days_ahead + 1):
        day = today + timedelta(days=offset)
        name = day_name(day)
        if name in have:
            continue
        lo, hi = day.timestamp(), (day + timedelta(days=1)).timestamp()
        # Created detached, filled with the default partition's rows of that day, then attached:
        # attaching checks the default partition holds none of the range, and now it does not.
        session.execute(text(f"CREATE TABLE {name} (LIKE {PARENT} INCLUDING DEFAULTS)"))
        session.execute(
            text(
                f"WITH moved AS (DELETE FROM {DEFAULT} WHERE start_time >= :lo AND start_time < :hi "
                f"RETURNING *) INSERT INTO {name} SELECT * FROM moved"
            ),
            {"lo": lo, "hi": hi},
        )
        session.execute(
            text(f"ALTER TABLE {PARENT} ATTACH PARTITION {name} FOR VALUES FROM ({lo}) TO ({hi})")
        )
        created.append(name)
    return created


def drop_expired(session: Session, *, now: float, retention_days: float, postgres: bool) -> int:
    """Remove step records that started more than `retention_days` ago; returns how many day
    partitions were dropped (PostgreSQL) or rows deleted (SQLite)."""
    cutoff = now - retention_days * DAY_SECONDS
    if not postgres:
        result = session.execute(text(f"DELETE FROM {PARENT} WHERE start_time < :cutoff"), {"cutoff": cutoff})
        return int(getattr(result, "rowcount", 0) or 0)
    dropped = 0
    for name, day in existing_days(session).items():
        if (day + timedelta(days=1)).timestamp() <= cutoff:
            session.execute(text(f"DROP TABLE {name}"))
            dropped += 1
    session.execute(text(f"DELETE FROM {DEFAULT} WHERE start_time < :cutoff"), {"cutoff": cutoff})
    return dropped
