"""Kill -9 the server while an alert is firing: after a restart the incident is still firing, its
page is not sent twice, and a page that had not gone out yet goes out."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.alerts.receivers import Receiver, receiver
from tests.api.test_jobs import SLOW_RANK, push_job
from tests.support import factories as f
from tests.support.server_process import free_port, start_server

# It counts pages, not how fast they go out: it runs in the parallel pass.
pytestmark = [pytest.mark.slow, pytest.mark.parallel]


def start(db: Path, rules: Path, hook: Receiver, http: int, grpc: int) -> subprocess.Popen[bytes]:
    env = {
        "SMON_ANALYSIS_INTERVAL": "0.5",
        "SMON_ALERT_RULES": str(rules),
        "SMON_PAGERDUTY_ROUTING_KEY": "rk",
        "SMON_PAGERDUTY_URL": hook.url + "/pd",
    }
    return start_server(f"sqlite:///{db}", http, grpc, env)


def triggers(hook: Receiver, job: str) -> int:
    return sum(1 for b in hook.bodies("/pd") if b["event_action"] == "trigger" and job in b["dedup_key"])


def test_kill_while_firing(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text("rules:\n  - name: job_straggling\n    for: 0\n")
    db = tmp_path / "smon.db"
    http, grpc = free_port(), free_port()
    target = SimpleNamespace(grpc_target=f"127.0.0.1:{grpc}")
    first, second = f.new_job_id("first"), f.new_job_id("second")
    with receiver() as hook:
        server = start(db, rules, hook, http, grpc)
        try:
            push_job(target, first, slow_rank=SLOW_RANK, slow_forward=0.03)  # type: ignore[arg-type]
            deadline = time.monotonic() + 60
            while triggers(hook, first) < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert triggers(hook, first) == 1
            hook.statuses[:] = [503] * 1000  # PagerDuty is down: the next page fails and waits
            push_job(target, second, slow_rank=SLOW_RANK, slow_forward=0.03)  # type: ignore[arg-type]
            deadline = time.monotonic() + 60
            while hook.failures < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert hook.failures >= 1
        finally:
            server.send_signal(signal.SIGKILL)
            server.wait(10)
        hook.statuses.clear()  # PagerDuty is back
        server = start(db, rules, hook, http, grpc)
        try:
            deadline = time.monotonic() + 60
            while triggers(hook, second) < 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert triggers(hook, second) == 1  # not lost
            time.sleep(2)  # several passes and sender rounds after the restart
            assert triggers(hook, first) == 1  # not sent twice
            firing = httpx.get(f"http://127.0.0.1:{http}/api/v1/alerts", params={"state": "firing"}).json()
            assert {a["job_id"] for a in firing["alerts"] if a["rule"] == "job_straggling"} >= {first, second}
        finally:
            server.terminate()
            server.wait(20)
