"""A job restarted under the same id, end to end over real gRPC and HTTP: each attempt's steps,
S, stragglers, trend and GPU-hours are its own, every job route says which attempt it shows, and an
older one stays reachable with `?attempt=N`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from tests.support import factories as f
from tests.support.settings import server_settings

WORLD = 4
STEPS = 40
WARMUP = 10  # SMON_WARMUP_STEPS' default: the first steps of every attempt are not analysed
SLOW_RANK = 2
STRAGGLING = 1.1


def push(
    server: BackgroundServer,
    job: str,
    run: str,
    steps: range,
    *,
    origin: float,
    slow_rank: int | None = None,
    reported: int | None = None,
    ranks: range = range(WORLD),
    seq: int = 1,
) -> float:
    """One batch per rank of `steps`, from the agents of `run` (one agent id per rank and run);
    returns when the last step ended (where a continuation starts)."""
    per_rank = f.dp_job_steps(WORLD, steps, slow_rank=slow_rank, slow_forward=0.03, origin=origin)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        for rank in ranks:
            batch = f.batch(
                job, rank, WORLD, seq=seq, steps=per_rank[rank], agent_id=f"{run}-{rank}", host=f"node-{rank}"
            )
            if reported is not None:
                batch.coords.attempt = reported
            ack = stub.Push(batch)
            assert ack.accepted == len(steps) and not ack.rejections
    return max(r.end_time for records in per_rank.values() for r in records)


def goodbye(server: BackgroundServer, job: str, run: str, seq: int) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        for rank in range(WORLD):
            stub.Push(
                f.batch(job, rank, WORLD, seq=seq, agent_id=f"{run}-{rank}", final=True, host=f"node-{rank}")
            )


def analyse(server: BackgroundServer, now: float | None = None) -> None:
    assert server.context is not None
    analysis_pass(server.context, now or time.time())


@pytest.fixture
def server(database_url: str) -> Iterator[BackgroundServer]:
    """Passes only when a test runs one: a pass of the loop between two ranks' batches would
    analyse the job on the ranks stored so far."""
    with BackgroundServer(server_settings(database_url, analysis_interval=3600)) as running:
        yield running


@pytest.fixture
def client(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=30) as c:
        yield c


def test_a_resubmitted_job_is_analysed_on_its_own_steps(
    server: BackgroundServer, client: httpx.Client
) -> None:
    job = f.new_job_id("resubmitted")
    now = time.time()
    # The first run has a straggler (rank 2), then every rank says goodbye (it crashed or ended).
    push(server, job, "run1", range(STEPS), origin=now - 120, slow_rank=SLOW_RANK)
    goodbye(server, job, "run1", seq=2)
    analyse(server)
    first = client.get(f"/api/v1/jobs/{job}/summary").json()
    assert (first["attempt"], first["attempts"]) == (1, 1)
    assert first["slowdown"] >= STRAGGLING and [s["rank"] for s in first["stragglers"]] == [SLOW_RANK]

    # Resubmitted under the same id: new processes (agents) whose steps count from 0 again, clean.
    push(server, job, "run2", range(STEPS), origin=now - 60)
    analyse(server)

    newest = client.get(f"/api/v1/jobs/{job}/summary").json()
    assert (newest["attempt"], newest["attempts"]) == (2, 2)
    assert newest["state"] == "running"
    assert (newest["from_step"], newest["to_step"], newest["steps_seen"]) == (
        WARMUP,
        STEPS - 1,
        STEPS - WARMUP,
    )
    assert newest["slowdown"] < STRAGGLING and newest["stragglers"] == []  # none of run 1's straggler
    old = client.get(f"/api/v1/jobs/{job}/summary", params={"attempt": 1}).json()
    assert (old["attempt"], old["attempts"], old["state"]) == (1, 2, "finished")
    assert old["slowdown"] == pytest.approx(first["slowdown"])
    assert [s["rank"] for s in old["stragglers"]] == [SLOW_RANK]

    steps = client.get(f"/api/v1/jobs/{job}/steps").json()
    assert (steps["attempt"], steps["attempts"]) == (2, 2)
    assert [s["step"] for s in steps["steps"]] == list(range(WARMUP, STEPS))  # each step once
    assert max(s["slowdown"] for s in steps["steps"]) < STRAGGLING
    old_steps = client.get(f"/api/v1/jobs/{job}/steps", params={"attempt": 1}).json()["steps"]
    assert min(s["slowdown"] for s in old_steps) >= STRAGGLING

    heat = client.get(f"/api/v1/jobs/{job}/heatmap").json()
    assert (heat["attempt"], heat["attempts"], heat["ranks"]) == (2, 2, list(range(WORLD)))
    assert heat["steps"] == list(range(WARMUP, STEPS))
    old_heat = client.get(f"/api/v1/jobs/{job}/heatmap", params={"attempt": 1}).json()
    hottest = max(range(WORLD), key=lambda r: max(v or 0 for v in old_heat["values"][r]))
    assert hottest == SLOW_RANK and max(v or 0 for v in heat["values"][SLOW_RANK]) < STRAGGLING
    forward = client.get(f"/api/v1/jobs/{job}/heatmap", params={"metric": "forward"}).json()
    old_forward = client.get(f"/api/v1/jobs/{job}/heatmap", params={"metric": "forward", "attempt": 1}).json()
    assert max(forward["values"][SLOW_RANK]) < 0.02 < min(old_forward["values"][SLOW_RANK])

    workers = client.get(f"/api/v1/jobs/{job}/workers").json()
    old_workers = client.get(f"/api/v1/jobs/{job}/workers", params={"attempt": 1}).json()
    assert (workers["attempt"], old_workers["attempt"]) == (2, 1)
    assert all(v is None or v < STRAGGLING for row in workers["values"] for v in row)  # no attribution
    assert old_workers["values"][SLOW_RANK][0] >= STRAGGLING

    worker = client.get(f"/api/v1/jobs/{job}/workers/{SLOW_RANK}").json()
    old_worker = client.get(f"/api/v1/jobs/{job}/workers/{SLOW_RANK}", params={"attempt": 1}).json()
    assert (worker["slowdown"] or 1.0) < STRAGGLING <= old_worker["slowdown"]
    assert [s["step"] for s in worker["steps"]] == list(range(STEPS))  # its records, each step once

    trend = client.get(f"/api/v1/jobs/{job}/trend").json()
    old_trend = client.get(f"/api/v1/jobs/{job}/trend", params={"attempt": 1}).json()
    assert trend["attempt"] == 2 and all(p["stragglers"] == [] for p in trend["points"])
    assert old_trend["attempt"] == 1 and all(p["stragglers"] == [SLOW_RANK] for p in old_trend["points"])
    assert sum(p["steps"] for p in trend["points"]) == STEPS - WARMUP  # not 2 × the steps

    ranks = client.get(f"/api/v1/jobs/{job}/ranks", params={"attempt": 1}).json()
    assert (ranks["attempt"], [r["rank"] for r in ranks["ranks"]]) == (1, list(range(WORLD)))

    # The jobs list shows the newest attempt: its S, and its own GPU-hours, not the old run's.
    row = client.get("/api/v1/jobs", params={"job_id": job}).json()["jobs"]
    assert len(row) == 1 and (row[0]["attempt"], row[0]["attempts"]) == (2, 2)
    assert row[0]["slowdown"] == pytest.approx(newest["slowdown"]) and row[0]["stragglers"] == 0
    listed = client.get(f"/api/v1/jobs/{job}/attempts").json()["attempts"]
    assert [(a["attempt"], a["state"]) for a in listed] == [(2, "running"), (1, "finished")]
    assert listed[1]["gpu_hours_wasted"] > 0 and row[0]["gpu_hours_wasted"] < listed[1]["gpu_hours_wasted"]
    assert newest["gpu_hours_wasted"] == pytest.approx(row[0]["gpu_hours_wasted"])

    missing = client.get(f"/api/v1/jobs/{job}/summary", params={"attempt": 3})
    assert missing.status_code == 404 and "no attempt 3" in missing.json()["detail"]
    assert client.get(f"/api/v1/jobs/{job}/summary", params={"attempt": 0}).status_code == 422
    assert client.get("/api/v1/jobs/no-such-job/attempts").status_code == 404


def test_a_restart_count_opens_a_new_attempt_and_late_batches_stay_in_the_old(
    server: BackgroundServer, client: httpx.Client
) -> None:
    """torchrun's elastic restart: the old workers are killed (no goodbye, heard from moments ago)
    and the new ones report TORCHELASTIC_RESTART_COUNT=1, resuming from a checkpoint at step 25."""
    job = f.new_job_id("elastic")
    now = time.time()
    push(server, job, "count0", range(30), origin=now - 120, reported=0)
    push(server, job, "count1", range(25, 25 + STEPS), origin=now - 60, reported=1)
    # The old run's rank 1 flushes its last records after the restart began: they stay in attempt 1.
    push(server, job, "count0", range(30, 32), origin=now - 100, reported=0, ranks=range(1, 2), seq=2)
    analyse(server)

    listed = client.get(f"/api/v1/jobs/{job}/attempts").json()["attempts"]
    assert [(a["attempt"], a["reported_attempt"], a["last_step"]) for a in listed] == [
        (2, 1, 25 + STEPS - 1),
        (1, 0, 31),
    ]
    assert listed[1]["state"] == "finished"  # replaced by attempt 2, though heard from just now
    newest = client.get(f"/api/v1/jobs/{job}/summary").json()
    assert (newest["attempt"], newest["from_step"], newest["to_step"]) == (2, 25 + WARMUP, 25 + STEPS - 1)
    old = client.get(f"/api/v1/jobs/{job}/summary", params={"attempt": 1}).json()
    assert (old["from_step"], old["to_step"]) == (WARMUP, 29)  # steps 30, 31: rank 1 alone


def test_a_rank_restarted_inside_an_attempt_stays_in_it(
    server: BackgroundServer, client: httpx.Client
) -> None:
    job = f.new_job_id("rank-restart")
    now = time.time()
    push(server, job, "run", range(30), origin=now - 120)
    # Rank 3's process died and came back (a new agent, no restart count): it re-runs from step 20.
    push(server, job, "rank3-again", range(20, 40), origin=now - 60, ranks=range(3, 4))
    push(server, job, "run", range(30, 40), origin=now - 58, ranks=range(3), seq=2)
    analyse(server)
    summary = client.get(f"/api/v1/jobs/{job}/summary").json()
    assert (summary["attempt"], summary["attempts"], summary["to_step"]) == (1, 1, 39)
    assert len(client.get(f"/api/v1/jobs/{job}/attempts").json()["attempts"]) == 1


@pytest.fixture
def paging_server(database_url: str, tmp_path: Path) -> Iterator[BackgroundServer]:
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "rules:\n"
        "  - name: job_straggling\n    for: 0\n    keep_firing_for: 0\n"
        "  - name: worker_straggling\n    for: 0\n    keep_firing_for: 0\n"
    )
    settings = server_settings(database_url, alert_rules=str(rules), analysis_interval=3600)
    with BackgroundServer(settings) as running:
        yield running


def test_a_new_attempt_does_not_page_for_the_old_ones_incident(paging_server: BackgroundServer) -> None:
    job = f.new_job_id("paged")
    now = time.time()
    with httpx.Client(base_url=paging_server.http_url, timeout=30) as c:

        def incidents() -> list[tuple[str, str, int | None]]:
            found = c.get("/api/v1/alerts", params={"job": job}).json()["alerts"]
            return sorted((a["rule"], a["state"], a["details"].get("attempt")) for a in found)

        push(paging_server, job, "run1", range(STEPS), origin=now - 120, slow_rank=SLOW_RANK)
        analyse(paging_server)
        assert incidents() == [("job_straggling", "firing", 1)]
        goodbye(paging_server, job, "run1", seq=2)  # the run ends: its incidents resolve
        # The final batches wake the server's own loop, whose pass may hold the job's lease while
        # ours runs (ours then skips the job): pass again until a pass has seen the goodbye.
        deadline = time.monotonic() + 30
        while True:
            analyse(paging_server)
            if incidents() == [("job_straggling", "resolved", 1)] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert incidents() == [("job_straggling", "resolved", 1)]

        ended = push(paging_server, job, "run2", range(STEPS), origin=now - 60)  # resubmitted, healthy
        analyse(paging_server)
        analyse(paging_server)
        assert c.get(f"/api/v1/jobs/{job}/summary").json()["attempt"] == 2
        assert incidents() == [("job_straggling", "resolved", 1)]

        # The straggler is back in the new run: a new incident, naming the attempt it holds in.
        push(paging_server, job, "run2", range(STEPS, STEPS + 30), origin=ended, slow_rank=SLOW_RANK, seq=2)
        analyse(paging_server)
        found = c.get("/api/v1/alerts", params={"job": job, "state": "firing"}).json()["alerts"]
        straggling = [a for a in found if a["rule"] == "job_straggling"]
        assert len(straggling) == 1 and straggling[0]["details"]["attempt"] == 2
        assert f"{job} (attempt 2)" in straggling[0]["summary"]
