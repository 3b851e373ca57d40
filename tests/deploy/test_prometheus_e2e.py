"""A real Prometheus scrapes a real SMon server fed by a real straggling training job (2 gloo ranks
under torchrun, rank 1 slow), reads S back through its HTTP API, and with the shipped rules loaded
puts the straggling alert in `firing`."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from smon_server.runtime import BackgroundServer
from tests.e2e.processes import forked, run_job_command
from tests.e2e.test_ddp_jobs import analysed_summary
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.tools import debian_tool

pytestmark = [pytest.mark.torch, pytest.mark.slow]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def smon(tmp_path: Path) -> Iterator[tuple[BackgroundServer, str]]:
    url = f"sqlite:///{tmp_path / 'smon.db'}"
    with BackgroundServer(server_settings(url, analysis_interval=3600)) as server:
        job = f.new_job_id("slow")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "SMON_DEMO_QUIET": "1",
            "SMON_SERVER": server.grpc_target,
            "SMON_JOB": job,
        }
        args = ["--steps", "40", "--device-ms", "30", "--slow-rank", "1", "--delay", "0.03"]
        done = run_job_command(forked(2, args, module="smon_server.demo.loop_train"), env, 300)
        assert done.returncode == 0, done.stderr[-3000:]
        analysed_summary(server, job, steps=40)
        yield server, job


def query(url: str, path: str, **params: str) -> Any:
    response = httpx.get(f"{url}{path}", params=params, timeout=10)
    response.raise_for_status()
    return response.json()["data"]


def test_prometheus_scrapes_smon_and_fires_the_shipped_rule(
    smon: tuple[BackgroundServer, str], tmp_path: Path
) -> None:
    binary = debian_tool("prometheus", "prometheus")
    server, job = smon
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["scrape_configs"][0]["static_configs"] = [{"targets": [server.http_url.removeprefix("http://")]}]
    # The shipped rules as they are, but without their `for`: the test cannot wait 5 minutes.
    rules = yaml.safe_load((DEPLOY / "rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        summary = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/summary", timeout=30).json()
        deadline = time.monotonic() + 90
        value = None
        firing: list[dict[str, Any]] = []
        while time.monotonic() < deadline and (value is None or not firing):
            time.sleep(1)
            try:
                result = query(url, "/api/v1/query", query=f'smon_job_slowdown_ratio{{job="{job}"}}')[
                    "result"
                ]
                value = float(result[0]["value"][1]) if result else None
                alerts = query(url, "/api/v1/alerts")["alerts"]
            except httpx.HTTPError:
                continue
            firing = [a for a in alerts if a["state"] == "firing" and a["labels"].get("job") == job]
        assert value == pytest.approx(summary["slowdown"]), "S read back through Prometheus"
        names = {a["labels"]["alertname"] for a in firing}
        assert names & {"SMonJobStraggling", "SMonJobStragglingCritical"}, firing
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
