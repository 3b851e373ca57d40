"""The settings of a server under test: loopback ports chosen by the kernel, quick passes."""

from __future__ import annotations

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
