"""Liveness and readiness probes for load balancers and Kubernetes."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from smon_server.api.deps import ContextDep

router = APIRouter(tags=["health"])

log = logging.getLogger(__name__)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up (no dependencies checked)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
def readyz(context: ContextDep) -> dict[str, str] | JSONResponse:
    """The database answers; a replica that cannot reach it should get no traffic."""
    try:
        with context.db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        # The reason goes to the log, not to whoever asks: it names the database's host and port.
        log.warning("readiness: database unreachable: %s", exc)
        return JSONResponse(
            status_code=503, content={"status": "unavailable", "error": "database unreachable"}
        )
    return {"status": "ok"}
