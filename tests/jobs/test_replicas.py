"""Two server processes on one PostgreSQL share a job: its ranks stream to different replicas, the
job has one analysis and one set of alerts, whichever replica survives a SIGKILL goes on
analysing it, and both put a restarted job's new run in the same new attempt."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from sqlalchemy import create_engine, text

from smon.v1 import ingest_pb2_grpc as pb_grpc
from tests.support import factories as f
from tests.support.server_process import free_port, start_server

pytestmark = pytest.mark.postgres

RANKS = 4
ENV = {"SMON_ANALYSIS_INTERVAL": "1", "SMON_ANALYSIS_WORKERS": "0", "SMON_STALL_SECONDS": "600"}


class Replica:
    def __init__(self, url: str) -> None:
        self.url = url
        self.grpc = free_port()
        self.http = free_port()
        self.process: subprocess.Popen[bytes] = start_server(url, self.http, self.grpc, ENV)

    def push(
        self,
        job: str,
        ranks: list[int],
        steps: range,
        seq: int,
        origin: float,
        *,
        run: str = "",
        reported: int | None = None,
        final: bool = False,
    ) -> None:
        records = f.dp_job_steps(RANKS, steps, slow_rank=2, slow_forward=0.020, origin=origin)
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            stub = pb_grpc.IngestStub(channel)
            for r in ranks:
                batch = f.batch(
                    job, r, RANKS, seq=seq, steps=records[r], agent_id=f"{job}{run}-{r}", final=final
                )
                if reported is not None:
                    batch.coords.attempt = reported
                ack = stub.Push(batch)
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


def test_replicas_put_a_restarted_jobs_new_run_in_one_attempt(
    replicas: list[Replica], postgres_url: str
) -> None:
    """Each job's new run starts on both replicas at the same moment, half its ranks on each."""
    a, b = replicas
    origin = time.time() - 120
    resubmitted, elastic = f.new_job_id("resubmitted"), f.new_job_id("elastic")
    for replica, ranks in ((a, [0, 1]), (b, [2, 3])):
        replica.push(resubmitted, ranks, range(0, 30), seq=1, origin=origin)
        replica.push(elastic, ranks, range(0, 30), seq=1, origin=origin, reported=0)
    for replica, ranks in ((a, [0, 1]), (b, [2, 3])):
        replica.push(resubmitted, ranks, range(0, 0), seq=2, origin=origin, final=True)  # goodbye
    gate = threading.Barrier(4)

    def new_run(replica: Replica, job: str, ranks: list[int], reported: int | None) -> None:
        gate.wait(10)
        replica.push(job, ranks, range(0, 30), seq=1, origin=origin + 60, run="-again", reported=reported)

    runs = [
        threading.Thread(target=new_run, args=(replica, job, ranks, reported))
        for job, reported in ((resubmitted, None), (elastic, 1))
        for replica, ranks in ((a, [0, 1]), (b, [2, 3]))
    ]
    for t in runs:
        t.start()
    for t in runs:
        t.join(60)
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as c:
            for job in (resubmitted, elastic):
                placed = c.execute(
                    text("SELECT agent_id, attempt FROM agents WHERE job_id = :j ORDER BY agent_id"),
                    {"j": job},
                ).all()
                assert {n for agent, n in placed if "-again-" in agent} == {2}, placed
                assert {n for agent, n in placed if "-again-" not in agent} == {1}, placed
                count = c.execute(text("SELECT count(*) FROM jobs WHERE job_id = :j"), {"j": job}).scalar()
                assert count == 2
    finally:
        engine.dispose()
    for replica in (a, b):
        for job in (resubmitted, elastic):
            deadline = time.monotonic() + 30
            while True:
                body = httpx.get(
                    f"http://127.0.0.1:{replica.http}/api/v1/jobs/{job}/summary", timeout=30
                ).json()
                if body["to_step"] == 29 or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert (body["attempt"], body["attempts"], body["from_step"], body["to_step"]) == (2, 2, 10, 29)
