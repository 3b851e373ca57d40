"""`smon alerts` as an on-call engineer runs it, against a real server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from smon_server.alerts.cli import duration
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from tests.api.test_jobs import SLOW_RANK, push_job
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.test_cli import smon


@pytest.fixture
def paging_server(database_url: str, tmp_path: Path) -> Iterator[BackgroundServer]:
    rules = tmp_path / "rules.yml"
    rules.write_text("rules:\n  - name: job_straggling\n    for: 0\n")
    with BackgroundServer(server_settings(database_url, alert_rules=str(rules), analysis_interval=3600)) as s:
        yield s


def test_list_ack_silence(paging_server: BackgroundServer) -> None:
    job = f.new_job_id("slow")
    push_job(paging_server, job, slow_rank=SLOW_RANK, slow_forward=0.03)
    assert paging_server.context is not None
    analysis_pass(paging_server.context, time.time())
    url = paging_server.http_url

    table = smon("alerts", "--url", url)
    assert table.returncode == 0, table.stderr
    assert job in table.stdout and "job_straggling" in table.stdout and "firing" in table.stdout

    listed = json.loads(smon("alerts", "--url", url, "--json", "list", "--job", job).stdout)["alerts"]
    (alert,) = [a for a in listed if a["rule"] == "job_straggling"]
    acked = smon("alerts", "--url", url, "ack", str(alert["id"]), "--by", "me")
    assert acked.returncode == 0 and json.loads(acked.stdout)["acked_by"] == "me"

    made = smon("alerts", "--url", url, "silence", "--job", job, "--for", "30m", "--comment", "fixing")
    assert made.returncode == 0, made.stderr
    silence = json.loads(made.stdout)
    assert silence["matchers"] == {"job": job} and silence["active"]
    ended = smon("alerts", "--url", url, "unsilence", str(silence["id"]))
    assert ended.returncode == 0 and not json.loads(ended.stdout)["active"]

    assert smon("alerts", "--url", url, "silence", "--for", "5m").returncode == 2  # nothing to match
    assert smon("alerts", "--url", url, "ack", "999999").returncode == 1
    down = smon("alerts", "--url", "http://127.0.0.1:9")
    assert down.returncode == 1 and "cannot reach SMon" in down.stderr


def test_durations() -> None:
    assert (duration("90"), duration("15m"), duration("2h"), duration("1d")) == (90, 900, 7200, 86400)
    with pytest.raises(Exception, match="not a duration"):
        duration("soon")
