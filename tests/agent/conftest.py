"""Shared fixtures for agent tests: a clean environment, a live ingest server, a fast attach."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

import smon
from tests.agent.ingest_server import IngestServer, RecordingIngest

_ENV = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RESTART_COUNT",
    "SMON_ATTEMPT",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SMON_SERVER",
    "SMON_JOB",
    "SMON_TOKEN",
    "SMON_DISABLE",
    "SMON_DP_RANK",
    "SMON_PP_RANK",
    "SMON_TP_RANK",
    "SMON_DP_SIZE",
    "SMON_PP_SIZE",
    "SMON_TP_SIZE",
    "SMON_NVML_INTERVAL",
    "SMON_FAKE_NVML",
    "SMON_AGENT_FLUSH_INTERVAL",
    "SMON_AGENT_HEARTBEAT_INTERVAL",
    "SMON_AGENT_FLUSH_TIMEOUT",
    "SMON_AGENT_QUEUE_SIZE",
    "SMON_AGENT_BATCH_RECORDS",
    "SMON_AGENT_BACKOFF_BASE",
    "SMON_AGENT_BACKOFF_CAP",
    "SMON_AGENT_COMPRESSION",
    "SMON_AGENT_RELAY",
    "SMON_AGENT_RELAY_FALLBACK",
    "LOCAL_WORLD_SIZE",
    "CUDA_VISIBLE_DEVICES",
]

# Short intervals so shipping tests take fractions of a second.
FAST: dict[str, Any] = dict(
    flush_interval=0.05,
    heartbeat_interval=0.2,
    flush_timeout=3.0,
    backoff_base=0.02,
    backoff_cap=0.1,
    nvml_interval=0,
    job="test-job",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ingest() -> Iterator[IngestServer]:
    server = IngestServer(RecordingIngest()).start()
    yield server
    server.stop()


@pytest.fixture
def attach_fast() -> Iterator[Any]:
    """attach() with short intervals; every monitor it made is closed after the test."""
    made: list[smon.Monitor] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        options = {**FAST, **kwargs}
        monitor = smon.attach(*args, **options)
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        monitor.close(timeout=0.5)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def op_spans(step: Any) -> list[Any]:
    """A step's spans without `gc` ones: a collection can land in any step of a test process."""
    return [s for s in step.spans if s.kind != "gc"]
