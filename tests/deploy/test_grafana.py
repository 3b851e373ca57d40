"""deploy/grafana: the dashboard follows Grafana's dashboard model, every query is valid PromQL
(checked by promtool) and names only metrics SMon exports, and links lead to SMon's pages."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from smon_server.store.db import Database
from tests.deploy.test_prometheus import exposition
from tests.support.tools import debian_tool

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "smon-overview.json"
# Grafana's built-in variables, replaced by something PromQL parses.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$job": "some-job"}


class GridPos(BaseModel):
    x: int = Field(ge=0, lt=24)
    y: int = Field(ge=0)
    w: int = Field(gt=0, le=24)
    h: int = Field(gt=0)


class Target(BaseModel):
    model_config = ConfigDict(extra="allow")
    expr: str
    refId: str  # Grafana's field names
    datasource: dict[str, str]


class Panel(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: int
    type: Literal["stat", "table", "timeseries", "bargauge", "heatmap", "text"]
    title: str
    gridPos: GridPos
    targets: list[Target] = Field(min_length=1)
    fieldConfig: dict[str, Any]


class Variable(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    type: Literal["datasource", "query", "textbox", "custom", "constant"]


class Templating(BaseModel):
    list: list[Variable]


class Dashboard(BaseModel):
    model_config = ConfigDict(extra="allow")
    uid: str = Field(min_length=1, max_length=40)
    title: str
    schemaVersion: int = Field(ge=36)
    panels: list[Panel] = Field(min_length=1)
    templating: Templating


@pytest.fixture(scope="module")
def dashboard() -> Dashboard:
    return Dashboard.model_validate(json.loads(DASHBOARD.read_text()))


def exprs(dashboard: Dashboard) -> list[str]:
    out = [t.expr for p in dashboard.panels for t in p.targets]
    out += [v.model_extra["definition"] for v in dashboard.templating.list if v.type == "query"]  # type: ignore[index]
    return out


def promql(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_dashboard_model(dashboard: Dashboard) -> None:
    ids = [p.id for p in dashboard.panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dashboard.panels:
        assert p.gridPos.x + p.gridPos.w <= 24, p.title
    names = {v.name for v in dashboard.templating.list}
    assert {"datasource", "job", "smon_url"} <= names
    used = {m for e in exprs(dashboard) for m in re.findall(r"\$(\w+)", e)} - {
        "__rate_interval",
        "__interval",
    }
    assert used <= names, used - names


def test_queries_name_exported_metrics(dashboard: Dashboard, db: Database) -> None:
    text = exposition(db)
    exported = {m.decode() for m in re.findall(rb"^# TYPE (\w+) ", text, flags=re.M)}
    # counters are queried as _total, histograms as their _bucket / _sum / _count series
    exported |= {m.decode() for m in re.findall(rb"^(\w+)[{ ]", text, flags=re.M)}
    exported |= {f"{m}_total" for m in exported} | {"ALERTS"}
    used = {m for e in exprs(dashboard) for m in re.findall(r"\b(smon_\w+|ALERTS)\b", e)}
    assert used and used <= exported, used - exported


def test_queries_are_valid_promql(dashboard: Dashboard, tmp_path: Path) -> None:
    promtool = debian_tool("promtool", "prometheus")
    queries = [promql(e) for e in exprs(dashboard) if not e.startswith("label_values(")]
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"q{i}", "expr": q} for i, q in enumerate(queries)]}
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


def test_links_open_smon_job_and_worker_pages(dashboard: Dashboard) -> None:
    links = [link["url"] for p in dashboard.panels for link in p.fieldConfig["defaults"].get("links", [])]
    assert "${smon_url}/jobs/${__field.labels.job}" in links
    assert "${smon_url}/jobs/${__field.labels.job}/workers/${__field.labels.rank}" in links


def test_provisioning_points_at_the_dashboards() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "smon.yml").read_text())
    assert datasources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "smon.yml").read_text())
    assert providers["providers"][0]["type"] == "file"
