"""The fleet view over stored analyses: who is charged, the suspect rule, the /hosts API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select

from smon_server.api.main import create_app
from smon_server.api.schemas import HostsOut
from smon_server.context import ServerContext
from smon_server.hosts import fleet
from smon_server.hosts.record import blamed
from smon_server.store.db import Database
from smon_server.store.models import Agent, GpuSample, HostIncident, StepRecord
from tests.hosts.builders import analysed_job, refresh
from tests.support.settings import server_settings

DAY = 86_400.0


@pytest.fixture
def now() -> float:
    import time

    return time.time()


@pytest.fixture
def fleet_db(db: Database, now: float) -> Database:
    """node-a straggles (slow_worker) in three jobs; node-b in one of its four; node-c only ever
    waits for others; one job with most ranks slow; one flagged analysis."""
    for i in range(3):
        analysed_job(
            db,
            f"train-{i}",
            hosts=["node-a", "node-c"],
            stragglers=[(0, "slow_worker", 1.3)],
            slowdown=1.3,
            at=now - (3 - i) * 3600,
        )
    analysed_job(
        db,
        "train-b",
        hosts=["node-c", "node-b"],
        stragglers=[(1, "slow_worker", 1.2)],
        slowdown=1.2,
        at=now - 7200,
    )
    for i in range(3):
        analysed_job(db, f"clean-b{i}", hosts=["node-b", "node-c"], at=now - 1800)
    # Every rank slow: job-wide, nobody's host.
    analysed_job(
        db,
        "all-slow",
        hosts=["node-b", "node-c", "node-d", "node-e"],
        stragglers=[(r, "slow_worker", 1.2) for r in range(3)],
        slowdown=1.25,
        at=now - 600,
    )
    # Not a machine's fault (evaluation on rank 0, a stage imbalance); a flagged replay.
    analysed_job(
        db, "eval-r0", hosts=["node-b", "node-c"], stragglers=[(0, "host_work", 1.4)], slowdown=1.4, at=now
    )
    analysed_job(
        db,
        "stage",
        hosts=["node-b", "node-c"],
        stragglers=[(1, "stage_imbalance", 1.4)],
        slowdown=1.4,
        at=now,
    )
    analysed_job(
        db,
        "flagged",
        hosts=["node-b", "node-c"],
        stragglers=[(0, "slow_worker", 1.4)],
        slowdown=1.4,
        at=now,
        flagged=True,
    )
    refresh(db, now)
    return db


@pytest.fixture
def client(fleet_db: Database, database_url: str) -> Iterator[TestClient]:
    context = ServerContext(settings=server_settings(database_url), db=fleet_db)
    with TestClient(create_app(context)) as c:
        yield c


def test_blame_goes_to_the_stragglers_own_host_for_machine_causes_only() -> None:
    def s(rank: int, cause: str) -> dict[str, object]:
        return {"rank": rank, "host": f"h{rank}", "cause": cause, "slowdown": 1.2}

    assert [x["rank"] for x in blamed([s(1, "slow_worker")], 4)] == [1]
    assert [x["rank"] for x in blamed([s(1, "gpu_throttling"), s(2, "data_loader")], 8)] == [1, 2]
    assert blamed([s(0, "host_work")], 4) == []  # rank 0's logging / evaluation
    assert [x["rank"] for x in blamed([s(3, "host_work")], 4)] == [3]
    for cause in (
        "stage_imbalance",
        "sequence_imbalance",
        "python_gc",
        "communication",
        "checkpoint_io",
        "hang",
    ):
        assert blamed([s(1, cause)], 4) == [], cause
    assert blamed([s(0, "slow_worker"), s(1, "slow_worker"), s(2, "slow_worker")], 4) == []  # job-wide


def test_only_the_host_that_keeps_straggling_is_suspect(client: TestClient) -> None:
    body = client.get("/api/v1/hosts").json()
    HostsOut.model_validate(body)  # the hand-written body has the documented shape
    assert body["since"].endswith("Z") and body["hosts"][0]["last_incident"].endswith("Z")
    by_host = {h["host"]: h for h in body["hosts"]}
    assert body["total"] == len(by_host) == 5
    assert body["hosts"][0]["host"] == "node-a"  # suspect first
    a, b, c = by_host["node-a"], by_host["node-b"], by_host["node-c"]
    assert (a["suspect"], a["straggler_jobs"], a["jobs"], a["suspect_jobs"]) == (True, 3, 3, 3)
    assert a["causes"] == [{"cause": "slow_worker", "jobs": 3}]
    assert sum(a["incidents_by_day"]) == 3 and len(a["incidents_by_day"]) == 7
    # node-b straggled once among the jobs it ran; node-c only waited for others.
    assert (b["suspect"], b["straggler_jobs"]) == (False, 1) and b["jobs"] >= 6
    assert (c["suspect"], c["straggler_jobs"]) == (False, 0) and c["jobs"] >= 8
    assert by_host["node-d"]["straggler_jobs"] == by_host["node-e"]["straggler_jobs"] == 0
    # 1.0 GPU-hour lost per job, all of it to node-a's rank
    assert a["gpu_hours_lost"] == pytest.approx(3.0)
    assert [h["host"] for h in client.get("/api/v1/hosts?suspect=true").json()["hosts"]] == ["node-a"]


def test_hosts_sort_page_and_period(client: TestClient, now: float) -> None:
    asc = client.get("/api/v1/hosts?sort=jobs&order=asc").json()["hosts"]
    assert [h["jobs"] for h in asc] == sorted(h["jobs"] for h in asc)
    first = client.get("/api/v1/hosts?sort=host&order=asc&limit=2").json()
    second = client.get("/api/v1/hosts?sort=host&order=asc&limit=2&offset=2").json()
    assert [h["host"] for h in first["hosts"] + second["hosts"]] == ["node-a", "node-b", "node-c", "node-d"]
    assert first["total"] == 5
    # An explicit period is aggregated on the spot, with the same numbers for the same period.
    stored = {h["host"]: h for h in client.get("/api/v1/hosts").json()["hosts"]}
    since = client.get("/api/v1/hosts").json()["since"]
    live = {h["host"]: h for h in client.get("/api/v1/hosts", params={"since": since}).json()["hosts"]}
    for host, h in stored.items():
        for key in ("jobs", "straggler_jobs", "suspect", "causes", "gpu_hours_lost"):
            assert live[host][key] == h[key], (host, key)
    # The last two hours: node-a's first job (3 h ago) is out of the period, not out of the rule.
    recent = client.get("/api/v1/hosts", params={"since": now - 2.5 * 3600}).json()["hosts"]
    a = next(h for h in recent if h["host"] == "node-a")
    assert (a["straggler_jobs"], a["suspect"]) == (2, True)
    assert client.get("/api/v1/hosts?sort=nope").status_code == 422
    assert client.get("/api/v1/hosts", params={"since": "2026-01-01T00:00:00"}).status_code == 422


def test_host_page_has_incidents_newest_first_verdict_and_advice(client: TestClient) -> None:
    a = client.get("/api/v1/hosts/node-a").json()
    assert [i["job_id"] for i in a["incidents"]] == ["train-2", "train-1", "train-0"]
    assert [i["job"] for i in a["incidents"]] == ["train-2", "train-1", "train-0"]
    first = a["incidents"][0]
    assert (first["rank"], first["cause"], first["gpu_uuid"], first["link"]) == (
        0,
        "slow_worker",
        "GPU-node-a-0",
        "/jobs/train-2",
    )
    assert first["slowdown"] == pytest.approx(1.3) and first["evidence"]["op_type"] == "forward-compute"
    assert a["verdict"].startswith("Suspect") and "3 distinct jobs" in a["verdict"]
    assert "burn-in" in a["recommendation"]  # healthy telemetry
    b = client.get("/api/v1/hosts/node-b").json()
    assert b["verdict"].startswith("Not suspect") and not b["suspect"]
    assert client.get("/api/v1/hosts/nowhere").status_code == 404


def test_gpu_faults_and_throttling_change_the_advice(db: Database, database_url: str, now: float) -> None:
    ecc: list[dict[str, Any]] = [
        {"rank": 0, "time": now - 900 + 5 * k, "gpu_uuid": "GPU-x", "ecc_uncorrected": 0 if k < 3 else 4}
        for k in range(6)
    ]
    ecc[4]["xid_events"] = [79]
    hot = [
        {"rank": 0, "time": now - 900 + 5 * k, "gpu_uuid": "GPU-y", "throttle_reasons": 0x40}
        for k in range(6)
    ]
    for i in range(3):
        analysed_job(
            db,
            f"x{i}",
            hosts=["node-x", "ok-1"],
            stragglers=[(0, "gpu_throttling", 1.5)],
            slowdown=1.5,
            at=now - i,
            samples=ecc if i == 0 else [],
        )
        analysed_job(
            db,
            f"y{i}",
            hosts=["node-y", "ok-2"],
            stragglers=[(0, "gpu_throttling", 1.5)],
            slowdown=1.5,
            at=now - i,
            samples=hot if i == 0 else [],
        )
    refresh(db, now)
    context = ServerContext(settings=server_settings(database_url), db=db)
    with TestClient(create_app(context)) as c:
        x = c.get("/api/v1/hosts/node-x").json()
        y = c.get("/api/v1/hosts/node-y").json()
        listed = {h["host"]: h for h in c.get("/api/v1/hosts").json()["hosts"]}
    assert x["gpu_events"]["ecc_uncorrected"] == 4 and [e["code"] for e in x["gpu_events"]["xid"]] == [79]
    assert "vendor's diagnostics" in x["recommendation"] and "GPU-x" in x["recommendation"]
    kinds = sorted((e["kind"], e.get("code")) for g in x["gpus"] for e in g["events"])
    assert kinds == [("ecc_uncorrected", None), ("xid", 79)]
    assert y["gpu_events"]["throttle_seconds"] == {"hw_thermal": pytest.approx(25.0)}
    assert "cooling" in y["recommendation"]
    assert listed["node-x"]["gpu_faults"] == 5 and listed["node-y"]["throttle_seconds"] == pytest.approx(25.0)


def test_figures_outlive_raw_steps_samples_and_agents(fleet_db: Database, now: float) -> None:
    with fleet_db.transaction() as s:
        for table in (StepRecord, GpuSample, Agent):
            s.execute(delete(table))
    refresh(fleet_db, now)
    with fleet_db.session() as s:
        figs = fleet.figures(s, since=now - 7 * DAY, now=now, policy=fleet.Policy())
    assert (figs["node-a"]["straggler_jobs"], figs["node-a"]["suspect"], figs["node-b"]["jobs"]) == (
        3,
        True,
        8,
    )


def test_incidents_age_out_of_the_suspect_rule(fleet_db: Database, now: float) -> None:
    later = now + 7 * DAY - 2.5 * 3600  # train-0 (3 h before now) is older than 7 days then
    refresh(fleet_db, later)
    with fleet_db.session() as s:
        figs = fleet.figures(s, since=later - 7 * DAY, now=later, policy=fleet.Policy())
    assert (figs["node-a"]["suspect_jobs"], figs["node-a"]["suspect"]) == (2, False)
    with fleet_db.session() as s:
        tighter = fleet.figures(s, since=later - 7 * DAY, now=later, policy=fleet.Policy(suspect_jobs=2))
    assert tighter["node-a"]["suspect"]


def test_host_history_expires_after_its_days(fleet_db: Database, now: float) -> None:
    """SMON_HOST_HISTORY_DAYS: history that ended before the cut goes (train-0 ran 3 h ago, the
    cut is 2.5 h ago), the rest stays and the figures follow."""
    with fleet_db.transaction() as s:
        deleted = fleet.expire(s, before=now - 2.5 * 3600)
    assert deleted > 0
    refresh(fleet_db, now)
    with fleet_db.session() as s:
        figs = fleet.figures(s, since=now - 7 * DAY, now=now, policy=fleet.Policy())
        incidents = s.scalars(select(HostIncident.job_id).where(HostIncident.host == "node-a")).all()
    assert sorted(incidents) == ["train-1", "train-2"]
    assert (figs["node-a"]["straggler_jobs"], figs["node-a"]["suspect"]) == (2, False)
    assert figs["node-b"]["straggler_jobs"] == 1  # newer than the cut: kept


def test_a_pass_touches_only_hosts_whose_rows_changed(db: Database, now: float) -> None:
    """Every pass charges every running job's hosts: a host whose agents were only heard again
    is not rewritten (nor its stored figures refreshed) until its last_seen moved a minute; a
    rank that joins, or a straggler incident, touches its host at once."""
    from smon_server.hosts import record
    from smon_server.store.models import AnalysisResult, HostJob, Job

    hosts = ["n-0", "n-0", "n-1", "n-1"]
    assert analysed_job(db, "live", hosts=hosts, at=now) == {"n-0", "n-1"}

    def heard(after: float, *, stragglers: list[dict[str, Any]] | None = None) -> set[str]:
        with db.transaction() as s:
            for a in s.scalars(select(Agent).where(Agent.job_id == "live")):
                a.last_seen = now + after
            job = s.get(Job, ("live", 1))
            result = s.get(AnalysisResult, ("live", 1))
            assert job is not None and result is not None
            if stragglers is not None:
                result.summary = {**(result.summary or {}), "stragglers": stragglers}
            s.flush()
            return record.record(s, job=job, result=result, now=now + after)

    def last_seen() -> dict[str, float]:
        with db.session() as s:
            return {r.host: r.last_seen for r in s.scalars(select(HostJob).where(HostJob.job_id == "live"))}

    assert heard(10) == set()
    assert last_seen() == {"n-0": now, "n-1": now}
    assert heard(61) == {"n-0", "n-1"}
    assert last_seen() == {"n-0": now + 61, "n-1": now + 61}
    straggler = {"rank": 3, "host": "n-1", "dp_rank": 3, "stage": 0, "slowdown": 1.3, "cause": "slow_worker"}
    assert heard(70, stragglers=[straggler]) == {"n-1"}


def test_a_pass_charges_hosts_from_the_agents_its_analysis_read(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis read the job's agents already (in its worker process, at scale): the pass
    charges the hosts from those, not from a second read of every agent in the server process."""
    import time

    from smon_server.hosts import record
    from smon_server.jobs.loop import analysis_pass
    from smon_server.store.models import HostJob
    from tests.support import factories as f
    from tests.support.stored import store_batches

    context = ServerContext.from_settings(server_settings(database_url, analysis_workers=0, warmup_steps=0))
    try:
        origin = time.time() - 120
        records = f.dp_job_steps(4, range(20), slow_rank=3, slow_forward=0.03, origin=origin)
        batches = [f.batch("read-once", r, 4, steps=records[r], host=f"n-{r // 2}") for r in range(4)]
        store_batches(context.db, batches, now=time.time())

        def read_again(**_: Any) -> None:
            raise AssertionError("the job's agents read again to charge its hosts")

        monkeypatch.setattr(record.queries, "rank_agents", read_again)
        assert analysis_pass(context, time.time()) == 1
        with context.db.session() as s:
            rows = s.scalars(select(HostJob).where(HostJob.job_id == "read-once")).all()
            assert sorted((r.host, r.ranks) for r in rows) == [("n-0", 2), ("n-1", 2)]
            incidents = s.scalars(select(HostIncident).where(HostIncident.job_id == "read-once")).all()
            assert [(i.host, i.rank) for i in incidents] == [("n-1", 3)]
    finally:
        context.close()
