"""An analysis worker process logs as the server does: a spawned process starts with no logging
set up, and its INFO lines (a kept window rebuilt whole) went nowhere."""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from smon_server.jobs import workers
from smon_server.settings import Settings


def _say() -> int:
    logging.getLogger("smon_server.jobs.window_ops").info("kept window rebuilt whole: a test")
    return os.getpid()


def test_a_worker_logs_info_lines_on_the_servers_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    settings = Settings(database_url="sqlite:///unused.db")
    with ProcessPoolExecutor(
        1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=workers._start,
        initargs=(settings, os.getpid(), False, logging.INFO),
    ) as pool:
        pid = pool.submit(_say).result(timeout=60)
    err = capfd.readouterr().err
    assert f"INFO smon_server.jobs.window_ops[{pid}]: kept window rebuilt whole: a test" in err
