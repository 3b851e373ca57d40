"""Liveness and readiness probes for load balancers and Kubernetes."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from smon_server.api.deps import ContextDep
from smon_server.store.db import DATABASE_UNAVAILABLE, answer_deadline

router = APIRouter(tags=["health"])

log = logging.getLogger(__name__)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (no dependencies checked). On the event loop itself: requests that wait
    for a hung database can fill the thread pool, and liveness must not depend on it."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
def readyz(context: ContextDep) -> dict[str, str] | JSONResponse:
    """The database answers within SMON_DATABASE_PROBE_TIMEOUT (a connection: the connect timeout,
    at most, and 2 s at least); a replica that cannot reach it should get no traffic. The reason
    goes to the log (once per outage: store/availability.py), not to whoever asks: it names the
    database's host and port."""
    db = context.db
    try:
        with answer_deadline(context.settings.database_probe_timeout), db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except DATABASE_UNAVAILABLE as exc:
        db.availability.failed(exc, "readiness probes failed")
        return _unavailable()
    except Exception:
        log.exception("readiness check failed")
        return _unavailable()
    db.availability.succeeded()
    return {"status": "ok"}


def _unavailable() -> JSONResponse:
    return JSONResponse(status_code=503, content={"status": "unavailable", "error": "database unreachable"})
