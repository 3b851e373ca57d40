"""A real `smon server` whose PostgreSQL sits behind a TCP proxy (tests/support/tcp_proxy.py) that the test
kills (the database cut off: connections reset, then refused) or stops with SIGSTOP (a database
that hangs: connections accepted, nothing answered). What the server's log says, what probes and
routes answer meanwhile, and what the agent counts as lost against what was stored."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import smon
from tests.support.databases import fresh_database
from tests.support.server_process import free_port, start_server
from tests.support.tcp_proxy import Proxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

# Short bounds, so that a hang costs the test seconds (defaults: 5 s, 30 s, 2 s).
SERVER_ENV = {
    "SMON_ANALYSIS_INTERVAL": "1",
    "SMON_ANALYSIS_WORKERS": "0",
    "SMON_DATABASE_CONNECT_TIMEOUT": "2",
    "SMON_DATABASE_STATEMENT_TIMEOUT": "1",
    "SMON_DATABASE_PROBE_TIMEOUT": "1",
}


class Server:
    """`smon server` on a proxied database, shared by this module's tests (a start costs seconds);
    each test begins and ends with the database reachable."""

    def __init__(self, database_url: str, proxy: Proxy, log: Path) -> None:
        self.database_url, self.proxy, self.log = database_url, proxy, log
        self.http, self.grpc = free_port(), free_port()
        proxied = make_url(database_url).set(host="127.0.0.1", port=proxy.listen_port)
        self.process = start_server(
            proxied.render_as_string(hide_password=False), self.http, self.grpc, SERVER_ENV, log_path=log
        )
        # The replica's first pass logs that it joined, some time after /readyz: before a test
        # begins, or that line lands among the lines the test reads as the outage's only ones.
        deadline = time.monotonic() + 30
        while "analysis replica" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)

    def get(self, path: str) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = httpx.get(f"http://127.0.0.1:{self.http}{path}", timeout=60)
        return response, time.monotonic() - started


@pytest.fixture(scope="module")
def server(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with fresh_database(postgres_admin_url, "smon_faults") as url:
        target = make_url(url)
        with Proxy(free_port(), target.host or "127.0.0.1", target.port or 5432) as proxy:
            running = Server(url, proxy, tmp_path_factory.mktemp("faults") / "server.log")
            try:
                yield running
            finally:
                running.process.terminate()
                running.process.wait(20)


class Run:
    """One job's agent stepping against the shared server, and what the log says from its start."""

    def __init__(self, server: Server, job: str) -> None:
        self.server, self.job = server, job
        self.log_from = len(server.log.read_text())
        self.mon = smon.attach(
            job=job, server=f"127.0.0.1:{server.grpc}", flush_interval=0.05, nvml_interval=0, backoff_cap=0.5
        )

    def train(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.mon.step()
            time.sleep(0.01)

    def logged(self, until: str, timeout: float = 30) -> str:
        """The server's log since this run began, once it holds `until`."""
        deadline = time.monotonic() + timeout
        while until not in (text := self.server.log.read_text()[self.log_from :]):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return text

    def stored(self) -> tuple[int, int]:
        engine = create_engine(self.server.database_url)
        try:
            with engine.connect() as c:
                count, distinct = c.execute(
                    text(
                        "SELECT count(*), count(DISTINCT s.step) FROM step_records s "
                        "JOIN jobs j ON j.key = s.job_key WHERE j.job_id = :job"
                    ),
                    {"job": self.job},
                ).one()
            return int(count), int(distinct)
        finally:
            engine.dispose()


def assert_reads_well(logged: str, outages: int) -> None:
    """One line as each outage begins, one as it ends; no traceback, no unretrieved future."""
    assert logged.count("database unavailable") == outages, logged
    assert logged.count("database available again") == outages, logged
    assert "Traceback" not in logged and " ERROR " not in logged, logged
    assert "never retrieved" not in logged, logged


def test_a_database_cut_off_reads_as_two_lines_and_loses_nothing(server: Server) -> None:
    run = Run(server, "cut-off")
    run.train(1.0)
    server.proxy.kill()  # connections reset; new ones refused
    run.train(3.0)
    server.proxy.start()
    run.train(1.0)
    run.mon.close(timeout=30)
    counters = run.mon.counters()
    steps = counters["last_step"] + 1
    logged = run.logged(until="database available again")
    seen = f"agent: {counters}\nserver's log since the run began:\n{logged}"
    assert run.stored() == (steps, steps), seen  # every step, once
    assert counters["dropped_records"] == counters["unconfirmed_records"] == 0, seen
    assert counters["resent_batches"] > 0, seen  # batches were refused meanwhile, and resent
    assert_reads_well(logged, outages=1)
    refused = re.search(r"available again after [\d.]+ s; meanwhile: .*?(\d+) ingest batches refused", logged)
    assert refused is not None and int(refused.group(1)) > 0, logged
    assert len(logged.splitlines()) == 2, logged  # the outage's two lines: nothing else


def test_a_hung_database_fails_fast_everywhere_and_counts_what_was_lost_truly(server: Server) -> None:
    run = Run(server, "hung")
    run.train(1.0)
    server.proxy.hang()  # SIGSTOP: the database answers nothing, refuses nothing
    try:
        run.train(1.0)
        # Without bounds each of these waited for as long as the database hung.
        ready, ready_took = server.get("/readyz")
        metrics, metrics_took = server.get("/metrics")
        jobs, jobs_took = server.get("/api/v1/jobs")
        run.train(0.5)
        run.mon.close(timeout=1.0)  # the job ends while the database hangs
        counters = run.mon.counters()
        time.sleep(2.0)  # the server gives up on what it was writing
    finally:
        server.proxy.resume()
    deadline = time.monotonic() + 30
    while server.get("/readyz")[0].status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    logged = run.logged(until="database available again")
    stored, distinct = run.stored()
    assert ready.status_code == 503 and ready_took < 15, (ready.status_code, ready_took)
    assert metrics.status_code == 200 and metrics_took < 15, (metrics.status_code, metrics_took)
    assert "smon_database_up 0.0" in metrics.text
    assert jobs.status_code == 503 and jobs.headers.get("retry-after"), jobs.status_code
    assert jobs_took < 15, jobs_took
    steps = counters["last_step"] + 1
    dropped, unconfirmed = counters["dropped_records"], counters["unconfirmed_records"]
    assert stored == distinct  # none twice
    assert dropped + unconfirmed > 0  # the hang held records back until the job ended
    # A record counted as dropped was not stored, and none stored is counted as dropped ...
    assert stored + dropped <= steps, (stored, dropped, unconfirmed, steps)
    # ... and every record not stored is counted as dropped or as unconfirmed.
    assert stored + dropped + unconfirmed >= steps, (stored, dropped, unconfirmed, steps)
    assert_reads_well(logged, outages=1)
