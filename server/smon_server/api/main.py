"""The FastAPI application: REST API, /metrics, probes (and, later, the dashboard)."""

from __future__ import annotations

from fastapi import FastAPI

from smon_server import __version__
from smon_server.api import alerts, health, jobs, metrics
from smon_server.context import ServerContext


def create_app(context: ServerContext) -> FastAPI:
    app = FastAPI(
        title="SMon",
        version=__version__,
        description="Straggler monitor for distributed training: what-if slowdown, blame, causes.",
    )
    app.state.context = context
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(jobs.router)
    app.include_router(alerts.router)
    return app
