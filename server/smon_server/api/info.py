"""/api/v1/info: what a client (the dashboard) needs to know about this server to present it."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import APIRouter
from pydantic import BaseModel, Field

from smon_server import __version__
from smon_server.api.deps import ApiTokenDep, ContextDep, SettingsDep
from smon_server.columns import PHASE_ORDER

router = APIRouter(prefix="/api/v1", tags=["info"])

# The phases agents report on their own (DESIGN §4) as heatmap metrics, then `other` (a step's
# untimed host work) and `gc` (its GC pauses). Custom phases are heatmap metrics too.
STANDARD_PHASES = [*PHASE_ORDER, "other", "gc"]


class InfoOut(BaseModel):
    version: str
    gpu_hour_price: float = Field(description="SMON_GPU_HOUR_PRICE: cost figures are shown when > 0")
    grafana_url: str | None = Field(description="SMON_GRAFANA_URL: where SMon's Grafana dashboards are")
    analysis_interval: float = Field(description="seconds between analysis passes: how often numbers change")
    stall_seconds: float
    warmup_steps: int
    straggling_threshold: float = Field(description="S at which a job counts as straggling (DESIGN §5)")
    attribution_threshold: float = Field(description="S from which a slowdown is attributed (DESIGN §5)")
    ingest_address: str = Field(description="host:port agents send to (SMON_SERVER), as far as it is known")
    phases: list[str] = Field(description="phase names usable as heatmap metrics")


@router.get("/info", response_model=InfoOut)
def info(settings: SettingsDep, context: ContextDep, _auth: ApiTokenDep) -> InfoOut:
    host = urlsplit(settings.public_url).hostname or "localhost"
    return InfoOut(
        version=__version__,
        gpu_hour_price=settings.gpu_hour_price,
        grafana_url=settings.grafana_url,
        analysis_interval=settings.analysis_interval,
        stall_seconds=settings.stall_seconds,
        warmup_steps=settings.warmup_steps,
        straggling_threshold=context.straggling_threshold,
        attribution_threshold=context.attribution_threshold,
        ingest_address=f"{host}:{context.grpc_port or settings.grpc_port}",
        phases=STANDARD_PHASES,
    )
