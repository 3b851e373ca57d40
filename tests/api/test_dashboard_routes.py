"""The dashboard's routes (one page for every DESIGN §6 path) and the API it needs beside §6."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from smon_server import dashboard
from smon_server.jobs import analysis as job_analysis
from smon_server.runtime import BackgroundServer
from smon_server.whatif.config import WhatIfConfig
from tests.api.test_jobs import SLOW_RANK, analyse, push_job
from tests.support import factories as f
from tests.support.factories import stored_job
from tests.support.settings import server_settings

PAGES = ["/", "/alerts", "/jobs/train-1", "/jobs/a%2Fb%3Cc%3E", "/jobs/train-1/workers/3"]


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in build: these tests are about routing and headers, not the bundle's contents."""
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><title>SMon</title><div id=app></div>")
    (dist / "assets" / "index-abc123.js").write_text("console.log('smon')")
    monkeypatch.setattr(dashboard, "DIST", dist)
    return dist


def test_every_page_path_serves_the_app_with_a_strict_policy(built: Path, sqlite_url: str) -> None:
    with BackgroundServer(server_settings(sqlite_url, api_token="t0ken")) as server:
        for path in PAGES:
            # The page itself holds no data: it loads without the token and asks for it.
            response = httpx.get(server.http_url + path)
            assert response.status_code == 200, path
            assert response.headers["content-type"].startswith("text/html")
            assert "<div id=app>" in response.text
            policy = response.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        asset = httpx.get(server.http_url + "/assets/index-abc123.js")
        assert asset.status_code == 200
        assert "immutable" in asset.headers["cache-control"]
        assert httpx.get(server.http_url + "/assets/missing.js").status_code == 404
        assert httpx.get(server.http_url + "/nope").status_code == 404
        # The data behind the pages still needs the token.
        assert httpx.get(server.http_url + "/api/v1/info").status_code == 401
        assert (
            httpx.get(server.http_url + "/api/v1/info", headers={"Authorization": "Bearer t0ken"}).status_code
            == 200
        )


def test_an_unbuilt_dashboard_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    monkeypatch.setattr(dashboard, "DIST", tmp_path / "absent")
    with BackgroundServer(server_settings(sqlite_url)) as server:
        response = httpx.get(server.http_url + "/jobs/x")
        assert response.status_code == 503
        assert "make web" in response.text
        assert httpx.get(server.http_url + "/api/v1/jobs").status_code == 200


def test_info_and_ranks(database_url: str) -> None:
    settings = server_settings(
        database_url,
        gpu_hour_price=2.5,
        grafana_url="https://grafana.example/",
        public_url="https://smon.example:8443",
    )
    with BackgroundServer(settings) as server:
        info = httpx.get(server.http_url + "/api/v1/info").json()
        assert info["gpu_hour_price"] == 2.5
        assert info["grafana_url"] == "https://grafana.example/"
        assert server.ports is not None
        assert info["ingest_address"] == f"smon.example:{server.ports.grpc}"
        assert {"forward", "backward", "grad_sync", "other", "gc"} <= set(info["phases"])
        assert info["straggling_threshold"] == WhatIfConfig().straggling_threshold  # the engine's
        assert info["attribution_threshold"] == WhatIfConfig().attribution_threshold

        assert server.context is not None
        with server.context.db.session() as session:
            stored_job(
                session, "a/b", time.time(), agents=[(1, 50.0, 1.0, False, 0), (0, 60.0, 1.0, False, 0)]
            )
            session.commit()
        ranks = httpx.get(server.http_url + "/api/v1/jobs/a%2Fb/ranks").json()
        assert [r["rank"] for r in ranks["ranks"]] == [0, 1]
        assert httpx.get(server.http_url + "/api/v1/jobs/nope/ranks").status_code == 404


def test_large_responses_are_compressed(sqlite_url: str) -> None:
    with BackgroundServer(server_settings(sqlite_url)) as server:
        assert server.context is not None
        with server.context.db.session() as session:
            for i in range(60):
                stored_job(session, f"job-{i:03d}", time.time())
            session.commit()
        response = httpx.get(server.http_url + "/api/v1/jobs", headers={"Accept-Encoding": "gzip"})
        assert response.headers.get("content-encoding") == "gzip"
        assert len(response.json()["jobs"]) == 60


@pytest.mark.parametrize("metric", ["slowdown", "forward"])
def test_heatmap_float32_cells_are_the_json_cells(server: BackgroundServer, metric: str) -> None:
    """encoding=f32 (what the dashboard asks for) carries the same cells as the JSON numbers."""
    job_id = f.new_job_id("f32")
    push_job(server, job_id, slow_rank=SLOW_RANK, slow_forward=0.03)
    analyse(server)
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        for params in ({}, {"max_ranks": 2, "max_steps": 7}, {"from_rank": 1, "to_rank": 2}):
            url = f"/api/v1/jobs/{job_id}/heatmap"
            plain = client.get(url, params={"metric": metric, **params}).json()
            packed = client.get(url, params={"metric": metric, "encoding": "f32", **params}).json()
            cells = np.frombuffer(base64.b64decode(packed.pop("values_f32")), dtype="<f4")
            assert packed.pop("values") == []
            assert {k: v for k, v in plain.items() if k not in ("values", "values_f32")} == packed
            want = np.array([[np.nan if v is None else v for v in row] for row in plain["values"]])
            assert cells.size == want.size > 0
            got = np.round(cells.astype(np.float64), 6).reshape(want.shape)
            np.testing.assert_array_equal(got, want)
            if metric == "slowdown" and not params:
                assert np.nanargmax(np.nanmean(got, axis=1)) == plain["ranks"].index(SLOW_RANK)
    assert client.is_closed


def test_heatmap_encoding_is_checked(server: BackgroundServer) -> None:
    # A job that exists: the job is resolved (JobDep) before the route's own parameters are
    # checked, so an unknown job is a 404 whatever it is asked with.
    job_id = f.new_job_id("encoding")
    push_job(server, job_id)
    response = httpx.get(f"{server.http_url}/api/v1/jobs/{job_id}/heatmap", params={"encoding": "png"})
    assert response.status_code == 422


def test_a_step_range_inside_the_stored_window_is_cut_from_the_stored_heatmap(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zooming the dashboard's heatmap into steps must not analyse them afresh (a pass's time on a
    big job): the cells are the stored analysis's, column for column."""
    job_id = f.new_job_id("zoom")
    push_job(server, job_id, slow_rank=SLOW_RANK, slow_forward=0.03)
    analyse(server)
    fresh: list[object] = []
    analyze_job = job_analysis.analyze_job

    def counted(**kwargs: Any) -> Any:
        fresh.append(kwargs["window"])
        return analyze_job(**kwargs)

    monkeypatch.setattr(job_analysis, "analyze_job", counted)
    url = f"{server.http_url}/api/v1/jobs/{job_id}/heatmap"
    whole = httpx.get(url, params={"max_steps": 8192}).json()
    steps = whole["steps"]
    lo, hi = steps[len(steps) // 4], steps[len(steps) // 2]
    zoomed = httpx.get(url, params={"from_step": lo, "to_step": hi}).json()
    assert zoomed["steps"] == [s for s in steps if lo <= s <= hi]
    cols = [steps.index(s) for s in zoomed["steps"]]
    assert zoomed["values"] == [[row[c] for c in cols] for row in whole["values"]]
    assert fresh == []
    # A range reaching outside the stored window is analysed as asked.
    httpx.get(url, params={"from_step": hi, "to_step": steps[-1] + 100}).raise_for_status()
    assert len(fresh) == 1
