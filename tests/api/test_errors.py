"""Requests the API cannot serve get a 4xx that says why, and a database that is away gets a 503:
never a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from smon_server.runtime import BackgroundServer
from tests.api.test_jobs import analyse, push_job
from tests.support import factories as f
from tests.support.server_process import free_port
from tests.support.settings import server_settings


@pytest.fixture
def client(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{server.http_url}/api/v1", timeout=30) as c:
        yield c


@pytest.mark.parametrize(
    "path",
    [
        f"/jobs/{{job}}/summary?from_step={2**63}",
        f"/jobs/{{job}}/steps?from_step=0&to_step={2**64}",
        f"/jobs/{{job}}/heatmap?to_step={2**63}",
        f"/jobs/{{job}}/summary?window={2**70}",
        f"/jobs/{{job}}/trend?from_step={2**63}",
        "/jobs/{job}/summary?from_step=-1",
    ],
)
def test_steps_past_what_is_stored_are_a_422(
    server: BackgroundServer, client: httpx.Client, path: str
) -> None:
    job = f.new_job_id()
    push_job(server, job)
    response = client.get(path.format(job=job))
    assert response.status_code == 422, response.text


def test_a_windowed_summary_of_a_job_is_served(server: BackgroundServer, client: httpx.Client) -> None:
    job = f.new_job_id()
    push_job(server, job)
    analyse(server)
    for query in ("window=5", "from_step=1&to_step=8"):
        response = client.get(f"/jobs/{job}/summary?{query}")
        assert response.status_code == 200, response.text
        assert response.json()["gpu_hours_wasted"] >= 0.0


def test_a_database_that_is_away_gets_503_and_probes_say_so_without_its_address() -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://smon@127.0.0.1:{port}/smon?connect_timeout=2"
    settings = server_settings(url, auto_migrate=False, analysis_interval=3600)
    with BackgroundServer(settings) as server, httpx.Client(base_url=server.http_url, timeout=30) as c:
        assert c.get("/healthz").status_code == 200
        ready = c.get("/readyz")
        assert ready.status_code == 503
        assert str(port) not in ready.text and "127.0.0.1" not in ready.text
        for path in ("/api/v1/jobs", "/api/v1/jobs/some-job/summary", "/api/v1/alerts"):
            response = c.get(path)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["retry-after"] == "5"


def test_a_job_id_with_slashes_is_reachable(server: BackgroundServer, client: httpx.Client) -> None:
    job = f"team/{f.new_job_id()}/run-1"
    push_job(server, job)
    analyse(server)
    quoted = job.replace("/", "%2F")
    for path in (f"/jobs/{quoted}/summary", f"/jobs/{job}/summary", f"/jobs/{quoted}/workers/0"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
    assert client.get(f"/jobs/{quoted}/summary").json()["job_id"] == job
    assert client.get(f"/jobs/{quoted}/workers/0").json()["rank"] == 0
    listed = [j["job_id"] for j in client.get("/jobs", params={"q": "team/"}).json()["jobs"]]
    assert listed == [job]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/jobs/a%00b/summary", None),
        ("GET", "/jobs/a%00b/workers/0", None),
        ("GET", "/jobs?q=a%00b", None),
        ("GET", "/jobs?job_id=%00", None),
        ("GET", "/alerts?job=a%00b", None),
        ("GET", "/jobs/{job}/heatmap?metric=for%00ward", None),
        ("POST", "/silences", {"matchers": {"job": "a\x00b"}, "duration_seconds": 60}),
        ("POST", "/silences", {"matchers": {"job": "a"}, "duration_seconds": 60, "comment": "\x00"}),
    ],
)
def test_a_nul_character_anywhere_is_a_422(
    server: BackgroundServer, client: httpx.Client, method: str, path: str, body: object
) -> None:
    """PostgreSQL cannot hold or even compare text with a NUL: a 422 that says so, not a 500."""
    job = f.new_job_id()
    push_job(server, job)
    response = client.request(method, path.format(job=job), json=body)
    assert response.status_code == 422, response.text
    assert "NUL" in response.text or "x00" in response.text
    assert client.get("/jobs", params={"job_id": job}).json()["total"] == 1  # the exact filter
