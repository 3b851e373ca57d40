"""End to end: real 2-rank gloo jobs whose ranks report distinct host names (SMON_HOST), a real
server on loopback. node-a is slow in two jobs with a sick GPU (FakeNvml: throttling, an XID,
uncorrectable ECC); node-b is slow once; in a fourth job every rank is slow. With the rule at
two jobs, node-a alone becomes suspect, with its GPU events in its evidence, and pages once."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from tests.alerts.receivers import Receiver, receiver
from tests.e2e.processes import forked, run_job_command
from tests.support.settings import server_settings

pytestmark = [pytest.mark.torch, pytest.mark.slow]

RANKS = 2
STEPS = 40
DELAY = "0.04"  # extra seconds per forward of a slow rank: S ≈ 1.3 on ~0.13 s steps
SICK = "throttled,ecc"  # SW + HW thermal slowdown, 2 uncorrectable ECC errors, XID 48


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, hook: Receiver) -> Iterator[dict[str, Any]]:
    """The four jobs, run and analysed once for the module's checks."""
    url = f"sqlite:///{tmp_path_factory.mktemp('hosts') / 'smon.db'}"
    settings = server_settings(
        url, analysis_interval=3600, host_suspect_jobs=2, webhook_url=f"{hook.url}/hook"
    )
    with BackgroundServer(settings) as server:
        jobs = {
            "a-first": run(server, ["node-a", "node-c"], slow_rank=0),
            "a-again": run(server, ["node-d", "node-a"], slow_rank=1),
            "b-once": run(server, ["node-b", "node-c"], slow_rank=0),
            "all-slow": run(server, ["node-b", "node-d"], all_slow=True),
        }
        for _ in range(3):  # passes after the jobs: the same incident, never a second page
            assert server.context is not None
            analysis_pass(server.context, time.time())
        api = f"{server.http_url}/api/v1"
        yield {
            "jobs": jobs,
            "hosts": httpx.get(f"{api}/hosts").json(),
            "node-a": httpx.get(f"{api}/hosts/node-a").json(),
            "node-b": httpx.get(f"{api}/hosts/node-b").json(),
            "alerts": httpx.get(f"{api}/alerts").json(),
        }


def run(
    server: BackgroundServer, hosts: list[str], *, slow_rank: int = -1, all_slow: bool = False
) -> dict[str, Any]:
    job = f"{'-'.join(hosts)}-{time.time_ns()}"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SMON_DEMO_QUIET": "1",
        "SMON_SERVER": server.grpc_target,
        "SMON_JOB": job,
        "SMON_NVML_INTERVAL": "0.5",
        "SMON_TEST_HOSTS": ",".join(hosts),
        "SMON_TEST_SICK_HOST": "node-a",
        "SMON_TEST_SICK_NVML": SICK,
        "SMON_TEST_ALL_SLOW": "1" if all_slow else "0",
        # Each rank plays a host of its own here (SMON_HOST), on one machine: node-b's relay would
        # be its LOCAL_RANK 0, which is node-a's rank, so its ranks would wait out the fallback.
        "SMON_AGENT_RELAY": "off",
    }
    args = ["--steps", str(STEPS), "--device-ms", "40", "--delay", DELAY, "--slow-rank", str(slow_rank)]
    done = run_job_command(forked(RANKS, args, module="tests.hosts.host_job"), env, 240)
    assert done.returncode == 0, done.stderr[-4000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = httpx.get(f"{server.http_url}/api/v1/jobs", params={"job_id": job}).json()["jobs"]
        if listed and listed[0]["last_step"] == STEPS - 1:
            break
        time.sleep(0.2)
    assert server.context is not None
    analysis_pass(server.context, time.time())
    summary = httpx.get(f"{server.http_url}/api/v1/jobs/{job}/summary", timeout=30).json()
    return {"job_id": job, "summary": summary}


def brief(summary: dict[str, Any]) -> str:
    keys = ("slowdown", "simulation_discrepancy", "discrepancy_flagged", "stragglers")
    return json.dumps({k: summary.get(k) for k in keys}, default=str)[:3000]


def test_each_job_names_its_own_straggler(fleet: dict[str, Any]) -> None:
    jobs = fleet["jobs"]
    for name, host in (("a-first", "node-a"), ("a-again", "node-a"), ("b-once", "node-b")):
        summary = jobs[name]["summary"]
        assert [s["host"] for s in summary["stragglers"]] == [host], brief(summary)
        assert not summary["discrepancy_flagged"], brief(summary)
    assert jobs["a-first"]["summary"]["stragglers"][0]["cause"] == "gpu_throttling"
    # Every rank slow: nobody stands out, nobody's host is charged.
    assert jobs["all-slow"]["summary"]["stragglers"] == [], brief(jobs["all-slow"]["summary"])


def test_only_the_host_slow_in_several_jobs_is_suspect(fleet: dict[str, Any]) -> None:
    listed = {h["host"]: h for h in fleet["hosts"]["hosts"]}
    assert sorted(listed) == ["node-a", "node-b", "node-c", "node-d"]
    assert fleet["hosts"]["hosts"][0]["host"] == "node-a"
    expected = {
        "node-a": (2, 2, True),
        "node-b": (2, 1, False),
        "node-c": (2, 0, False),
        "node-d": (2, 0, False),
    }
    assert {h: (f["jobs"], f["straggler_jobs"], f["suspect"]) for h, f in listed.items()} == expected
    assert listed["node-a"]["causes"][0]["cause"] == "gpu_throttling"
    assert listed["node-a"]["gpu_hours_lost"] > 0


def test_the_sick_gpu_is_in_the_suspect_hosts_evidence(fleet: dict[str, Any]) -> None:
    a = fleet["node-a"]
    events = a["gpu_events"]
    assert [x["code"] for x in events["xid"]] == [48, 48]  # one per job (each a fresh FakeNvml)
    assert events["ecc_uncorrected"] == 2  # new once: the same GPU UUID had 2 already in the second job
    assert events["throttle_seconds"]["hw_thermal"] > 1.0 and events["throttle_seconds"]["sw_thermal"] > 1.0
    kinds = {e["kind"] for g in a["gpus"] for e in g["events"]}
    assert kinds == {"xid", "ecc_uncorrected", "throttle"}
    assert [i["job_id"] for i in a["incidents"]] == [
        fleet["jobs"][j]["job_id"] for j in ("a-again", "a-first")
    ]
    assert {i["rank"] for i in a["incidents"]} == {0, 1}
    assert a["verdict"].startswith("Suspect")
    assert "vendor's diagnostics" in a["recommendation"] and "XID 48" in a["recommendation"]
    b = fleet["node-b"]
    assert not b["suspect"] and [i["job_id"] for i in b["incidents"]] == [fleet["jobs"]["b-once"]["job_id"]]
    assert b["gpu_events"]["xid_count"] == 0


def test_the_suspect_host_pages_once(fleet: dict[str, Any], hook: Receiver) -> None:
    suspect = [a for a in fleet["alerts"]["alerts"] if a["rule"] == "host_suspect"]
    assert [(a["host"], a["state"]) for a in suspect] == [("node-a", "firing")]
    deadline = time.monotonic() + 20
    pages: list[Any] = []
    while time.monotonic() < deadline and not pages:
        pages = [b for b in hook.bodies("/hook") if b["alerts"][0]["labels"]["alertname"] == "host_suspect"]
        time.sleep(0.1)
    time.sleep(1.0)  # a second page would be sent by now
    pages = [b for b in hook.bodies("/hook") if b["alerts"][0]["labels"]["alertname"] == "host_suspect"]
    assert len(pages) == 1
    alert = pages[0]["alerts"][0]
    assert alert["labels"]["host"] == "node-a" and alert["status"] == "firing"
    assert "GPU-fake" in alert["annotations"]["gpus"]
    assert set(alert["annotations"]["jobs"].split(", ")) == {
        fleet["jobs"][j]["job_id"] for j in ("a-first", "a-again")
    }
