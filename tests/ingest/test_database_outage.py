"""PostgreSQL stopped under load and started again: the server answers UNAVAILABLE meanwhile (no
ack for anything not committed), the agent keeps its batches and resends them, and every step ends
up stored exactly once. The cluster is a throwaway one this test makes with Debian's PostgreSQL
binaries, so stopping it disturbs nothing else."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

import smon
from tests.support.server_process import free_port, start_server

pytestmark = pytest.mark.postgres

STEPS = 300


class Cluster:
    """A PostgreSQL cluster in a temporary folder, on its own port."""

    def __init__(self, folder: Path) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            pytest.skip("PostgreSQL server binaries are not installed (Debian package postgresql)")
        self.bin = Path(found[-1]).parent
        self.data = folder / "data"
        self.port = free_port()
        folder.chmod(0o777)
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_postgres, str(self.bin / tool), *args], check=True, capture_output=True)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data}"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-w", "-l", str(self.data / "log"), "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    if shutil.which("runuser") is None and os.geteuid() == 0:
        pytest.skip("runuser is needed to run PostgreSQL as a non-root user")
    # Not pytest's tmp_path: its folders are private to root, and the cluster runs as postgres.
    folder = Path(tempfile.mkdtemp(prefix="smon-pg-"))
    try:
        c = Cluster(folder)
        c.start()
        yield c
        stop = [*c.as_postgres, str(c.bin / "pg_ctl"), "-D", str(c.data), "-m", "immediate", "stop"]
        subprocess.run(stop, capture_output=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_steps_sent_while_the_database_is_down_are_stored_once_it_is_back(cluster: Cluster) -> None:
    http = free_port()
    server = start_server(cluster.url, http, grpc := free_port(), {"SMON_ANALYSIS_INTERVAL": "3600"})
    during: dict[str, httpx.Response] = {}
    try:
        mon = smon.attach(job="outage", server=f"127.0.0.1:{grpc}", flush_interval=0.05, nvml_interval=0)
        down_at, up_at = 100, 200
        for step in range(STEPS):
            if step == down_at:
                # Some steps stored first (the scrape below reads their counter): on a loaded
                # machine the agent's first batch can still be on its way at step 100.
                deadline = time.monotonic() + 60
                while mon.counters()["acked_batches"] == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                cluster.stop()  # under load: batches are in flight
            if step == down_at + 20:  # what an operator and Prometheus see meanwhile
                during["readyz"] = httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=30)
                during["metrics"] = httpx.get(f"http://127.0.0.1:{http}/metrics", timeout=30)
            if step == up_at:
                cluster.start()
            mon.step()
            time.sleep(0.01)
        mon.close(timeout=30)  # delivers what is left, now that the database is back
        counters = mon.counters()
        assert counters["dropped_records"] == 0
        engine = create_engine(cluster.url.replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect() as c:
            count, distinct = c.execute(
                text(
                    "SELECT count(*), count(DISTINCT s.step) FROM step_records s "
                    "JOIN jobs j ON j.key = s.job_key WHERE j.job_id = 'outage'"
                )
            ).one()
        engine.dispose()
        assert (count, distinct) == (STEPS, STEPS)
        assert during["readyz"].status_code == 503
        # The scrape still works: no job series, the database marked down, ingest counters there.
        assert during["metrics"].status_code == 200
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(during["metrics"].text)
            for s in family.samples
        }
        assert samples[("smon_database_up", ())] == 0
        assert samples[("smon_ingest_records_total", (("kind", "step"),))] > 0
        assert not any(name.startswith("smon_job_") for name, _ in samples)
        after = httpx.get(f"http://127.0.0.1:{http}/metrics", timeout=30).text
        assert "smon_database_up 1.0" in after
    finally:
        server.kill()
        server.wait(10)
