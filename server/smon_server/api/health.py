"""Liveness and readiness probes for load balancers and Kubernetes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from smon_server.api.deps import ContextDep

router = APIRouter(tags=["health"])


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
        return JSONResponse(status_code=503, content={"status": "unavailable", "error": str(exc)})
    return {"status": "ok"}
