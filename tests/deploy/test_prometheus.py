"""deploy/prometheus: the scrape config and alerting rules pass promtool, the rules' unit tests pass,
they use only metrics SMon exports, and SMon's /metrics exposition passes `promtool check metrics`."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from smon_server.context import ServerContext
from smon_server.settings import Settings
from smon_server.store.db import Database
from smon_server.store.models import AnalysisResult, HostSummary
from tests.support.factories import stored_job
from tests.support.tools import debian_tool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    return debian_tool("promtool", "prometheus")


def run(promtool: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [promtool, *args], cwd=DEPLOY, input=stdin, capture_output=True, timeout=120, check=False
    )


def test_config_and_rules_are_valid(promtool: str) -> None:
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "rules.yml")):
        done = run(promtool, *args)
        assert done.returncode == 0, (done.stdout + done.stderr).decode()


def test_rules_fire_once_and_resolve(promtool: str) -> None:
    done = run(promtool, "test", "rules", "rules_test.yml")
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
    assert b"SUCCESS" in done.stdout


def exposition(db: Database) -> bytes:
    now = time.time()
    with db.transaction() as s:
        stored_job(s, "slow", now, agents=[(0, 100, 1, False, 3), (1, 100, 1, False, 0)])
        s.add(
            AnalysisResult(
                job_id="slow",
                computed_at=now,
                state="running",
                steps_seen=10,
                slowdown=1.4,
                waste_fraction=1 - 1 / 1.4,
                step_seconds=0.5,
                top_workers=[{"rank": 1, "host": "node-1", "gpu_uuid": "GPU-1", "slowdown": 1.4}],
            )
        )
        s.add(
            HostSummary(
                host="node-1",
                first_seen=now - 600,
                last_seen=now,
                jobs=4,
                straggler_jobs=3,
                suspect=True,
                suspect_jobs=3,
                causes=[{"cause": "slow_worker", "jobs": 3}],
                gpu_events={},
                incidents_by_day=[0, 0, 0, 0, 0, 1, 2],
                refreshed_at=now,
            )
        )
    # The registry a server builds and GET /metrics serves (api/metrics.py).
    context = ServerContext(settings=Settings(database_url=db.url, analysis_workers=0), db=db)
    context.ingest_stats.records.labels(kind="step").inc(10)
    context.ingest_stats.rejected.labels(reason="non_finite").inc()
    return generate_latest(context.registry)


def test_metrics_exposition_is_lint_clean(promtool: str, db: Database) -> None:
    text = exposition(db)
    assert b'smon_job_slowdown_ratio{job="slow"} 1.4' in text
    assert b'smon_job_gpu_wasted_seconds_total{job="slow"} 9000.0' in text  # 2.5 GPU-hours
    assert b'smon_host_straggler_jobs{host="node-1"} 3.0' in text
    assert b'smon_host_suspect{host="node-1"} 1.0' in text
    done = run(promtool, "check", "metrics", stdin=text)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    ).decode()


def test_rules_use_only_exported_metrics(db: Database) -> None:
    exported = set(re.findall(rb"^# TYPE (\w+) ", exposition(db), flags=re.M))
    exported |= {name + b"_total" for name in exported}  # counters are exposed with _total
    rules = yaml.safe_load((DEPLOY / "rules.yml").read_text())
    used = {
        name.encode()
        for group in rules["groups"]
        for rule in group["rules"]
        for name in re.findall(r"\bsmon_\w+", rule["expr"])
    }
    assert used and used <= exported, used - exported
