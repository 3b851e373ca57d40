"""GET /metrics: the server's Prometheus registry in the text exposition format. With
SMON_API_TOKEN set it needs the token too (Prometheus: `authorization: {credentials_file: ...}`):
job ids, hosts and slowdowns are not for anyone who can reach the port."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from smon_server.api.deps import ApiTokenDep, ContextDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(context: ContextDep, _auth: ApiTokenDep) -> Response:
    return Response(generate_latest(context.registry), media_type=CONTENT_TYPE_LATEST)
