"""The settings of a server under test: loopback ports chosen by the kernel, quick passes."""

from __future__ import annotations

import time

from smon_server.runtime import BackgroundServer
from smon_server.settings import Settings


def server_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "grpc_host": "127.0.0.1",
        "grpc_port": 0,
        "analysis_interval": 0.5,
        # In the server process: timing tests stay quick. The end-to-end jobs and
        # tests/jobs/test_workers.py run analyses in worker processes, as a server does by default.
        "analysis_workers": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def after_first_pass(server: BackgroundServer, timeout: float = 60.0) -> BackgroundServer:
    """`server` once its analysis loop's first pass (run at start, on an empty database) is over:
    a test that stores steps and runs passes itself must not race that one (on a loaded machine
    it could start after the test's first write and analyse it at the real time)."""
    assert server.context is not None
    histogram = server.context.analysis_stats.pass_seconds
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = [s.value for m in histogram.collect() for s in m.samples if s.name.endswith("_count")]
        if counts and counts[0] >= 1:
            return server
        time.sleep(0.02)
    raise TimeoutError(f"the analysis loop's first pass did not end within {timeout} s")
