"""The FastAPI application: REST API, /metrics, probes and the dashboard."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from smon_server import __version__, dashboard
from smon_server.api import alerts, health, hosts, info, jobs, metrics
from smon_server.api.deps import ApiContext, require_api_token
from smon_server.store.db import DATABASE_UNAVAILABLE

log = logging.getLogger(__name__)


def create_app(context: ApiContext) -> FastAPI:
    """The app serving `context`'s server (the composition root hands it in)."""
    app = build_app(protected=bool(context.settings.api_token))
    app.state.context = context
    return app


def build_app(*, protected: bool) -> FastAPI:
    """Routes, models and middleware, with no server behind them yet: what the OpenAPI schema is
    made of (api/openapi.py needs no database or workers to print it)."""
    # With an API token the schema sits behind it too, and the interactive docs are off: a browser
    # cannot send the bearer token when it opens /docs (use the schema with a client, or put SMon
    # behind an auth proxy and leave the token unset).
    app = FastAPI(
        title="SMon",
        version=__version__,
        description="Straggler monitor for distributed training: what-if slowdown, blame, causes.",
        openapi_url=None if protected else "/openapi.json",
        docs_url=None if protected else "/docs",
        redoc_url=None if protected else "/redoc",
    )
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(info.router)
    app.include_router(jobs.router)
    app.include_router(alerts.router)
    app.include_router(hosts.router)
    if protected:

        @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_api_token)])
        def openapi() -> dict[str, Any]:
            return app.openapi()

    for error in DATABASE_UNAVAILABLE:
        app.add_exception_handler(error, database_unavailable)
    app.add_middleware(RejectNul)
    # A 4,096-rank heatmap is ~2 MB of JSON and ~0.7 MB gzipped: dashboards over a VPN notice.
    # Level 1: Starlette's default (9) spent ~1 s on that body, level 1 15 ms for 4% more bytes.
    app.add_middleware(GZipMiddleware, minimum_size=4096, compresslevel=1)
    dashboard.mount(app)
    return app


class RejectNul:
    """422 for a NUL character anywhere in a request's path or query: no stored string holds one
    (ingest refuses them), and PostgreSQL cannot even compare text with one, which turned
    `/jobs/a%00b/summary` or `?q=%00` into a 500 from the database driver."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            b"%00" in scope.get("raw_path", b"")
            or b"%00" in scope.get("query_string", b"")
            or "\x00" in scope["path"]
        ):
            response = JSONResponse(
                status_code=422, content={"detail": "NUL characters are not allowed in paths or parameters"}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After, not 500: the request is fine, the database is away for now. The
    outage is logged once, with a count of the requests it turned away (store/availability.py)."""
    context: ApiContext = request.app.state.context
    context.db.availability.failed(exc, "API requests answered 503")
    return JSONResponse(
        status_code=503, content={"detail": "database unavailable; retry later"}, headers={"Retry-After": "5"}
    )
