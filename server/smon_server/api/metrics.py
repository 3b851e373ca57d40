"""GET /metrics: the server's Prometheus registry in the text exposition format. With
SMON_API_TOKEN set it needs the token too (Prometheus: `authorization: {credentials_file: ...}`):
job ids, hosts and slowdowns are not for anyone who can reach the port."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from smon_server.api.deps import ApiTokenDep, ContextDep
from smon_server.store.db import answer_deadline

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(context: ContextDep, _auth: ApiTokenDep) -> Response:
    """The database is read within SMON_DATABASE_PROBE_TIMEOUT, inside a scrape's own deadline:
    a database that hangs leaves the job series out (`smon_database_up 0`), as one that is down
    does, and the process's own counters are still scraped."""
    with answer_deadline(context.settings.database_probe_timeout):
        body = generate_latest(context.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
