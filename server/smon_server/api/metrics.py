"""GET /metrics: the server's Prometheus registry in the text exposition format."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from smon_server.api.deps import ContextDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(context: ContextDep) -> Response:
    return Response(generate_latest(context.registry), media_type=CONTENT_TYPE_LATEST)
