"""/api/v1/hosts: the fleet view, which hosts keep slowing jobs and what their GPUs report."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Path, Query, Response

from smon_server.api.deps import MAX_STEP, ApiTokenDep, DbDep, SettingsDep
from smon_server.api.schemas import HostDetailOut, HostsOut, utc
from smon_server.hosts import pages
from smon_server.hosts.fleet import Policy
from smon_server.views.hosts import iso

router = APIRouter(prefix="/api/v1", tags=["hosts"])

SinceQuery = Annotated[
    datetime | None,
    Query(description="start of the period (ISO 8601, or Unix seconds); default 7 days ago"),
]


def _seconds(since: datetime | None) -> float | None:
    if since is None:
        return None
    if since.tzinfo is None:
        raise HTTPException(status_code=422, detail="`since` needs a time zone (e.g. 2026-11-20T00:00:00Z)")
    return since.timestamp()


def _times(f: dict[str, Any]) -> dict[str, Any]:
    out = dict(f)
    for k in ("last_incident", "first_seen", "last_seen"):
        out[k] = utc(f[k]) if f.get(k) is not None else None
    events = dict(f["gpu_events"])
    events["xid"] = [{**x, "time": utc(x["time"])} for x in events.get("xid") or []]
    out["gpu_events"] = events
    return out


@router.get("/hosts", response_model=HostsOut)
def list_hosts(
    db: DbDep,
    settings: SettingsDep,
    _auth: ApiTokenDep,
    since: SinceQuery = None,
    suspect: Annotated[bool | None, Query(description="only suspect hosts (or only the others)")] = None,
    q: Annotated[str | None, Query(max_length=256, description="host name contains this")] = None,
    sort: Annotated[pages.SortKey, Query(description="the column to sort by")] = "suspect",
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_STEP)] = 0,
) -> Response:
    """Every host seen in the period; by default suspect hosts first, then those that straggled
    in the most jobs. The rows are the stored JSON of each host's row (views/hosts.py), joined
    here in the shape of `HostsOut` (tests check it): validating and encoding 100 nested rows
    per request was most of its time."""
    rows, total, start = pages.page(
        db,
        now=time.time(),
        policy=Policy.of(settings),
        since=_seconds(since),
        suspect=suspect,
        contains=q,
        sort=sort,
        descending=order == "desc",
        limit=limit,
        offset=offset,
    )
    head = f'{{"total":{total},"limit":{limit},"offset":{offset},"since":"{iso(start)}","hosts":['
    return Response(content=head + ",".join(rows) + "]}", media_type="application/json")


@router.get("/hosts/{host}", response_model=HostDetailOut)
def get_host(
    db: DbDep,
    settings: SettingsDep,
    _auth: ApiTokenDep,
    host: Annotated[str, Path(max_length=256)],
    since: SinceQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="incidents and jobs at most")] = 200,
) -> HostDetailOut:
    """The host's incidents (newest first), the jobs it ran, its GPUs' health events, and why it
    is or is not suspect."""
    found = pages.detail(
        db, host=host, now=time.time(), policy=Policy.of(settings), since=_seconds(since), limit=limit
    )
    if found is None:
        raise HTTPException(status_code=404, detail=f"no host {host!r}")
    out = _times(found)
    out["since"] = utc(found["since"])
    out["incidents"] = [
        {
            **i,
            "job": i["job_id"],
            "first_seen": utc(i["first_seen"]),
            "last_seen": utc(i["last_seen"]),
            "link": f"/jobs/{quote(i['job_id'], safe='')}"
            + (f"?attempt={i['attempt']}" if i["attempt"] > 1 else ""),
        }
        for i in found["incidents"]
    ]
    out["jobs_run"] = [
        {**j, "first_seen": utc(j["first_seen"]), "last_seen": utc(j["last_seen"])} for j in found["jobs_run"]
    ]
    out["gpus"] = [
        {"gpu_uuid": g["gpu_uuid"], "events": [{**e, "time": utc(e["time"])} for e in g["events"]]}
        for g in found["gpus"]
    ]
    return HostDetailOut(**out)
