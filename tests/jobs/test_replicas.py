"""Two server processes on one PostgreSQL share a job: its ranks stream to different replicas, the
job has one analysis and one set of alerts, and whichever replica survives a SIGKILL goes on
analysing it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from sqlalchemy import create_engine, text

from smon.v1 import ingest_pb2_grpc as pb_grpc
from tests import factories as f
from tests.server_process import free_port, start_server

pytestmark = pytest.mark.postgres

RANKS = 4
ENV = {"SMON_ANALYSIS_INTERVAL": "1", "SMON_ANALYSIS_WORKERS": "0", "SMON_STALL_SECONDS": "600"}


class Replica:
    def __init__(self, url: str) -> None:
        self.url = url
        self.grpc = free_port()
        self.process: subprocess.Popen[bytes] = start_server(url, free_port(), self.grpc, ENV)

    def push(self, job: str, ranks: list[int], steps: range, seq: int, origin: float) -> None:
        records = f.dp_job_steps(RANKS, steps, slow_rank=2, slow_forward=0.020, origin=origin)
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            stub = pb_grpc.IngestStub(channel)
            for r in ranks:
                ack = stub.Push(f.batch(job, r, RANKS, seq=seq, steps=records[r], agent_id=f"{job}-{r}"))
                assert ack.accepted == len(steps)

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no shutdown code runs, its transactions and leases die with it
        self.process.wait(10)


@pytest.fixture
def replicas(postgres_url: str) -> Iterator[list[Replica]]:
    started = [Replica(postgres_url), Replica(postgres_url)]
    yield started
    for r in started:
        if r.process.poll() is None:
            r.kill()


def analysed_to(url: str, job: str, step: int, timeout: float = 30.0) -> float:
    """Seconds until the stored analysis of `job` reaches `step`."""
    engine = create_engine(url)
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            with engine.connect() as c:
                reached = c.execute(
                    text("SELECT to_step FROM analysis_results WHERE job_id = :j"), {"j": job}
                ).scalar()
            if reached is not None and reached >= step:
                return time.monotonic() - start
            time.sleep(0.2)
    finally:
        engine.dispose()
    raise AssertionError(f"job {job} not analysed to step {step} within {timeout} s")


def stored(url: str, job: str) -> tuple[list[str], int, int | None]:
    """(the job's alert rules, one entry per alert; its analysis rows; the worst rank named)."""
    engine = create_engine(url)
    by_job = {"j": job}
    try:
        with engine.connect() as c:
            rules = [r for (r,) in c.execute(text("SELECT rule FROM alerts WHERE job_id = :j"), by_job)]
            rows = c.execute(text("SELECT count(*) FROM analysis_results WHERE job_id = :j"), by_job).scalar()
            worst = c.execute(
                text("SELECT worst_rank FROM analysis_results WHERE job_id = :j"), by_job
            ).scalar()
        return sorted(rules), int(rows or 0), worst
    finally:
        engine.dispose()


def test_replicas_share_a_job_and_the_survivor_takes_it_over(
    replicas: list[Replica], postgres_url: str
) -> None:
    a, b = replicas
    job = f.new_job_id("replicas")
    origin = time.time() - 120
    a.push(job, [0, 1], range(0, 60), seq=1, origin=origin)
    b.push(job, [2, 3], range(0, 60), seq=1, origin=origin)
    analysed_to(postgres_url, job, 59)
    time.sleep(3)  # a few passes of both replicas
    rules, rows, worst = stored(postgres_url, job)
    assert rows == 1 and worst == 2  # both replicas' ranks in one analysis, which names rank 2
    assert "job_straggling" in rules and len(rules) == len(set(rules)), rules  # one alert per rule

    # A dies; its agents reconnect to B, and B alone analyses the job from now on.
    a.kill()
    b.push(job, [0, 1, 2, 3], range(60, 100), seq=2, origin=origin + 5)
    assert analysed_to(postgres_url, job, 99) < 15

    # And the other way round: A comes back, B dies.
    again = Replica(postgres_url)
    replicas.append(again)
    b.kill()
    again.push(job, [0, 1, 2, 3], range(100, 140), seq=3, origin=origin + 10)
    assert analysed_to(postgres_url, job, 139) < 15
    rules, rows, worst = stored(postgres_url, job)
    assert rows == 1 and worst == 2 and len(rules) == len(set(rules)), rules
