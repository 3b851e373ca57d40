"""The server killed with SIGKILL in the middle of a job and started again: the agent resends
whatever was not acked, so every step of the job is stored, and none twice (DESIGN §8)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sqlalchemy import create_engine, text

from tests.support.server_process import free_port, start_server

# It counts what was stored, not how fast: it runs in the parallel pass.
pytestmark = [pytest.mark.slow, pytest.mark.parallel, pytest.mark.postgres]
STEPS = 300

JOB = textwrap.dedent(
    """
    import sys, time, smon
    mon = smon.attach(job=sys.argv[1], server=sys.argv[2], flush_interval=0.2, backoff_base=0.1,
                      backoff_cap=1.0, flush_timeout=60.0)
    for step in range(int(sys.argv[3])):
        with mon.phase("forward"):
            time.sleep(0.02)
        mon.step()
    mon.close()
    """
)


def stored(url: str, job: str) -> tuple[int, int]:
    """(records, distinct steps) of the job's single rank."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            row = c.execute(
                text(
                    "SELECT count(*), count(DISTINCT r.step) FROM step_records r "
                    "JOIN jobs j ON j.key = r.job_key WHERE j.job_id = :job"
                ),
                {"job": job},
            ).one()
        return int(row[0]), int(row[1])
    finally:
        engine.dispose()


def test_server_killed_mid_job_loses_and_duplicates_nothing(postgres_url: str) -> None:
    http, grpc = free_port(), free_port()
    job = f"killed-{time.time_ns()}"
    server = start_server(postgres_url, http, grpc)
    agent = subprocess.Popen([sys.executable, "-c", JOB, job, f"127.0.0.1:{grpc}", str(STEPS)])
    try:
        deadline = time.monotonic() + 60
        while stored(postgres_url, job)[0] < STEPS // 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        before, _ = stored(postgres_url, job)
        assert STEPS // 3 <= before < STEPS  # killed mid-job
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        time.sleep(1.0)  # the agent keeps training and queueing while no server runs
        server = start_server(postgres_url, http, grpc)
        assert agent.wait(120) == 0
        assert stored(postgres_url, job) == (STEPS, STEPS)
    finally:
        agent.kill()
        server.terminate()
        server.wait(20)
