"""End to end: a real 2-stage × 2-replica pipeline job (torch p2p send / recv, GPipe over 4
micro-batches, gloo) with `smon.attach` on every rank, analysed by a real server."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from smon_server.runtime import BackgroundServer
from tests.e2e.test_ddp_jobs import analysed_summary, run_job
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow]

PIPELINE = "smon_server.demo.pipeline_train"
STEPS = 30


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('pp') / 'smon.db'}"
    with BackgroundServer(server_settings(url, analysis_interval=3600)) as server:
        yield server


def pipeline_summary(server: BackgroundServer, name: str, args: list[str]) -> tuple[str, dict]:
    job = f"{name}-{time.time_ns()}"
    done = run_job(
        ["--microbatches", "4", *args],
        env={"SMON_SERVER": server.grpc_target, "SMON_JOB": job},
        module=PIPELINE,
        steps=STEPS,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return job, analysed_summary(server, job, steps=STEPS)


def test_heavy_last_stage_is_stage_imbalance(live_server: BackgroundServer) -> None:
    job, summary = pipeline_summary(live_server, "heavy", ["--heavy-last-stage", "3"])
    assert summary["diagnoses"][0]["cause"] == "stage_imbalance"
    assert summary["diagnoses"][0]["evidence"]["stage"] == 1
    by_stage = summary["attribution"]["by_stage"]
    assert by_stage["1"] > by_stage["0"]
    assert summary["m_s"] > 0.5
    grid = httpx.get(f"{live_server.http_url}/api/v1/jobs/{job}/workers").json()
    assert (grid["dp_ranks"], grid["stages"]) == ([0, 1], [0, 1])
    # S_w of the last stage's workers above the first stage's, on both replicas
    assert all(row[1] > row[0] for row in grid["values"])


def test_skewed_sequence_lengths_are_sequence_imbalance(live_server: BackgroundServer) -> None:
    _, summary = pipeline_summary(live_server, "seqskew", ["--seq-skew"])
    first = summary["diagnoses"][0]
    assert first["cause"] == "sequence_imbalance"
    assert first["evidence"]["seq_sq_correlation"] >= 0.9
    assert summary["slowdown"] >= 1.1
