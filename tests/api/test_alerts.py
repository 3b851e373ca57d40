"""/api/v1/alerts and /silences against a real server whose analysis loop evaluates the rules."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from tests.api.test_jobs import SLOW_RANK, push_job
from tests.support import factories as f
from tests.support.settings import server_settings


@pytest.fixture
def paging_server(database_url: str, tmp_path: Path) -> Iterator[BackgroundServer]:
    """Rules that fire at once (`for: 0`), and a loop that runs only when the test says so."""
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "rules:\n  - name: job_straggling\n    for: 0\n  - name: worker_straggling\n    for: 0\n"
    )
    settings = server_settings(database_url, alert_rules=str(rules), analysis_interval=3600)
    with BackgroundServer(settings) as server:
        yield server


def test_a_straggling_job_raises_one_incident_that_can_be_acked_and_silenced(
    paging_server: BackgroundServer,
) -> None:
    job = f.new_job_id("slow")
    push_job(paging_server, job, slow_rank=SLOW_RANK, slow_forward=0.03)
    assert paging_server.context is not None
    analysis_pass(paging_server.context, time.time())
    with httpx.Client(base_url=paging_server.http_url, timeout=30) as c:
        found = c.get("/api/v1/alerts", params={"job": job}).json()["alerts"]
        by_rule = {a["rule"]: a for a in found}
        straggling = by_rule["job_straggling"]
        assert straggling["state"] == "firing" and straggling["dedup_key"] == f"smon/{job}/job_straggling"
        assert straggling["severity"] in ("warning", "critical")
        assert "slower than it would without stragglers" in straggling["summary"]
        assert sum(1 for a in found if a["rule"] == "job_straggling") == 1  # one per job, not per rank

        assert [
            a["id"] for a in c.get("/api/v1/alerts", params={"state": "open", "job": job}).json()["alerts"]
        ]
        assert c.get("/api/v1/alerts", params={"state": "bogus"}).status_code == 422

        acked = c.post(f"/api/v1/alerts/{straggling['id']}/ack", json={"by": "oncall"}).json()
        assert acked["acked_by"] == "oncall" and acked["acked_at"]
        assert c.post("/api/v1/alerts/999999/ack", json={}).status_code == 404

        made = c.post(
            "/api/v1/silences",
            json={"matchers": {"job": job}, "duration_seconds": 600, "comment": "maintenance"},
        )
        assert made.status_code == 201 and made.json()["active"]
        analysis_pass(paging_server.context, time.time())
        again = c.get("/api/v1/alerts", params={"job": job, "state": "firing"}).json()["alerts"]
        assert again and all(a["silenced"] for a in again)
        ended = c.delete(f"/api/v1/silences/{made.json()['id']}").json()
        assert not ended["active"]
        assert c.post("/api/v1/silences", json={"matchers": {}, "duration_seconds": 5}).status_code == 422
        assert (
            c.post("/api/v1/silences", json={"matchers": {"pod": "x"}, "duration_seconds": 5}).status_code
            == 422
        )

        text = c.get("/metrics").text
    firing = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "smon_alerts_firing" and s.labels["rule"] == "job_straggling"
    ]
    assert firing and firing[0].value >= 1
