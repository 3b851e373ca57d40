"""A host's figures as one row of `GET /hosts` (the `HostOut` shape), written once per refresh.

The stored figures keep this rendering beside them (`host_summaries.row_json`), so a page of the
list is the rows' text joined, with no JSON decoded, validated or encoded per request.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

LIST_XIDS = 3  # newest XIDs a list row carries (the host page has them all)
_FIELDS = (
    "host",
    "jobs",
    "straggler_jobs",
    "gpu_hours_lost",
    "causes",
    "gpu_events",
    "gpu_faults",
    "throttle_seconds",
    "suspect",
    "suspect_jobs",
    "last_incident",
    "incidents_by_day",
    "first_seen",
    "last_seen",
)


def iso(seconds: float) -> str:
    """A time as the API writes its datetimes (UTC, `Z`, as pydantic does)."""
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def list_row(f: dict[str, Any]) -> str:
    """The JSON of one list row from a host's figures (hosts/fleet.py `figures`)."""
    events = f["gpu_events"]
    row = {k: f[k] for k in _FIELDS}
    for k in ("last_incident", "first_seen", "last_seen"):
        row[k] = iso(f[k]) if f[k] is not None else None
    row["gpu_events"] = {
        "xid": [{**x, "time": iso(x["time"])} for x in events.get("xid", [])[:LIST_XIDS]],
        "xid_count": events.get("xid_count", 0),
        "ecc_uncorrected": events.get("ecc_uncorrected", 0),
        "throttle_seconds": events.get("throttle_seconds", {}),
    }
    return json.dumps(row, separators=(",", ":"))
