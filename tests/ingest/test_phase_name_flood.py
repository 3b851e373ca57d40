"""One client sending 100,000 distinct phase names costs only its own job: over real gRPC, a job
whose records name a phase per span (StepTables, the agent's wire form) keeps every record, its
names past SMON_MAX_PHASE_NAMES are stored as `other` and counted (on /metrics and in its
summary), and a job sent afterwards, with a custom phase of its own, is stored and analysed exactly
as the same job sent before the flood."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from smon.table import to_table
from smon.v1 import ingest_pb2 as pb
from smon.v1 import ingest_pb2_grpc as pb_grpc
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.store.kinds import DEFAULT_MAX_PHASE_NAMES
from smon_server.store.models import Job, SpanKind, StepRecord
from tests.support import factories as f
from tests.support.settings import server_settings

NAMES = 100_000
PER_BATCH = 50_000  # a StepTable's span kinds are uint16 indexes: two tables
SPANS_PER_RECORD = 4_000  # within SMON_MAX_SPANS_PER_STEP
WORLD = 4


@pytest.fixture
def server(postgres_url: str) -> Iterator[BackgroundServer]:
    """On PostgreSQL, as a shared server runs (tests/store/test_kinds.py has SQLite's limits)."""
    with BackgroundServer(server_settings(postgres_url, analysis_interval=3600)) as running:
        yield running


def _flood(first_name: int, first_step: int, origin: float) -> pb.StepTable:
    """A StepTable of one rank's records whose spans each name a phase of their own (`eval:<n>`),
    built as an agent's columns are (little-endian arrays)."""
    counts = [SPANS_PER_RECORD] * (PER_BATCH // SPANS_PER_RECORD)
    counts += [PER_BATCH - sum(counts)] if PER_BATCH % SPANS_PER_RECORD else []
    steps = np.arange(first_step, first_step + len(counts), dtype="<i8")
    starts = origin + steps.astype("<f8")
    owner = np.repeat(np.arange(len(counts)), counts)
    within = np.arange(PER_BATCH) - np.repeat(np.cumsum(counts) - counts, counts)
    return pb.StepTable(
        records=len(counts),
        step=steps.tobytes(),
        start_time=starts.tobytes(),
        end_time=(starts + 0.5).tobytes(),
        duration=np.full(len(counts), 0.5, "<f8").tobytes(),
        gc_count=np.zeros(len(counts), "<u4").tobytes(),
        gc_seconds=np.zeros(len(counts), "<f8").tobytes(),
        span_count=np.asarray(counts, "<u4").tobytes(),
        kinds=[f"eval:{first_name + i}" for i in range(PER_BATCH)],
        span_kind=np.arange(PER_BATCH, dtype="<u2").tobytes(),
        span_start=(starts[owner] + within * 1e-4).astype("<f8").tobytes(),
        span_duration=np.full(PER_BATCH, 5e-5, "<f8").tobytes(),
    )


def _job(stub: pb_grpc.IngestStub, job: str, origin: float) -> None:
    """A DP job with a straggler and a custom phase (`compute`) on every step."""
    per_rank = f.dp_job_steps(WORLD, range(30), slow_rank=2, slow_forward=0.03, origin=origin)
    for rank, records in per_rank.items():
        for r in records:
            r.spans.add(kind="compute", start=r.spans[1].start, duration=0.002)  # inside forward
        b = f.batch(job, rank, WORLD, steps=[])
        b.step_table.CopyFrom(to_table(records))
        ack = stub.Push(b)
        assert (ack.accepted, list(ack.rejections)) == (len(records), [])


def _folded(server: BackgroundServer) -> float:
    body = httpx.get(f"{server.http_url}/metrics", timeout=30).text
    return sum(
        s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "smon_ingest_spans_folded_total"
    )


@pytest.mark.postgres
def test_a_flood_of_phase_names_costs_only_its_own_job(server: BackgroundServer) -> None:
    assert server.context is not None
    origin = time.time() - 600
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.IngestStub(channel)
        _job(stub, "before", origin)
        stored = 0
        for seq, first in enumerate(range(0, NAMES, PER_BATCH), start=1):
            b = f.batch("flood", 0, 1, seq=seq, steps=[])
            b.step_table.CopyFrom(_flood(first, 1000 * seq, origin))
            ack = stub.Push(b, timeout=120)
            assert (ack.accepted, list(ack.rejections)) == (b.step_table.records, [])
            stored += b.step_table.records
        _job(stub, "after", origin + 300)
    analysis_pass(server.context, time.time())

    folded = NAMES - DEFAULT_MAX_PHASE_NAMES
    assert _folded(server) == folded
    with server.context.db.session() as session:
        keys = dict(session.execute(select(Job.job_id, Job.key)).all())
        count = dict(
            session.execute(select(StepRecord.job_key, func.count()).group_by(StepRecord.job_key)).all()
        )
        names = dict(session.execute(select(SpanKind.job_key, func.count()).group_by(SpanKind.job_key)).all())
        compute = session.scalar(
            select(func.count()).where(SpanKind.name == "compute", SpanKind.job_key == keys["after"])
        )
    # The flood's own records are all kept; its dictionary holds its limit and `other`.
    assert count[keys["flood"]] == stored
    assert names[keys["flood"]] == DEFAULT_MAX_PHASE_NAMES + 1
    assert count[keys["after"]] == count[keys["before"]] == WORLD * 30 and compute == 1

    with httpx.Client(base_url=server.http_url, timeout=60) as client:
        flood = client.get("/api/v1/jobs/flood/summary").json()
        assert [(n["kind"], n["count"]) for n in flood["data_quality_notes"]] == [
            ("phase_names_folded", folded)
        ]
        assert "eval:" in flood["data_quality_notes"][0]["message"]
        before = client.get("/api/v1/jobs/before/summary").json()
        after = client.get("/api/v1/jobs/after/summary").json()
    for body in (before, after):
        assert body["analysis_state"] == "ok" and body["data_quality_notes"] == []
        assert body["slowdown"] > 1.1 and [s["rank"] for s in body["stragglers"]] == [2]
        assert "compute" in body["attribution"]["by_op_type"]
    assert after["slowdown"] == pytest.approx(before["slowdown"], rel=1e-9)
    assert after["attribution"] == before["attribution"]
