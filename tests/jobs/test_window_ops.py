"""A pass built on the op table kept from the pass before gives the answer of a pass built from
scratch (jobs/window_ops.py): the same summary, step series and heatmap, to the digits shown."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.jobs import analysis, window_cache
from smon_server.jobs import window_ops as window_ops_module
from smon_server.jobs.window_cache import WindowCache
from smon_server.jobs.window_ops import WindowOps, window_ops
from smon_server.settings import Settings
from smon_server.store import migrate, window_reader
from smon_server.store.db import Database
from smon_server.store.models import Job
from smon_server.store.queries import StepWindow, resolve_window
from smon_server.store.writes import write_batches
from smon_server.whatif import batches
from smon_server.whatif.ops import OpTable
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.stored import store_batches

RANKS = 4
WINDOW = 30


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database)
    yield database
    database.dispose()


def _steps(first: int, count: int, origin: float) -> tuple[dict[int, list[pb.StepRecord]], float]:
    """DP steps: rank 2 slow in forward from step 40 to 70; a GC pause nested in rank 1's backward
    every 5th step; a checkpoint phase on every rank at step 25 only (an op type that slides out of
    the window); rank 0 idles 8 ms after its optimizer every 7th step (host work)."""
    out: dict[int, list[pb.StepRecord]] = {r: [] for r in range(RANKS)}
    t = origin
    for step in range(first, first + count):
        one = f.dp_job_steps(
            RANKS, [step], slow_rank=2 if 40 <= step < 70 else None, slow_forward=0.015, origin=t
        )
        end = max(rec.end_time for recs in one.values() for rec in recs)
        for r, (rec,) in one.items():
            if r == 1 and step % 5 == 0:
                backward = next(s for s in rec.spans if s.kind == "backward")
                rec.spans.append(pb.Span(kind="gc", start=backward.start + 0.002, duration=0.004))
                rec.gc_count, rec.gc_seconds = 1, 0.004
            if step == 25:
                rec.spans.append(pb.Span(kind="checkpoint", start=rec.end_time, duration=0.030))
                rec.end_time += 0.030
                rec.duration += 0.030
            if r == 0 and step % 7 == 0:
                rec.end_time += 0.008
                rec.duration += 0.008
            out[r].append(rec)
        t = max(end, *(rec.end_time for recs in out.values() for rec in recs[-1:])) + 0.0005
    return out, t


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    """What a pass stores and serves, with floats to 9 significant digits (more than shown)."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.9g}") if math.isfinite(value) else str(value)
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items() if k != "computed_at"}
        if isinstance(value, list | tuple):
            return [rounded(v) for v in value]
        return value

    grid = result["rank_slowdown"]
    return rounded(
        {
            "summary": result["summary"],
            "steps": result["steps"],
            "workers": result["workers"],
            "rank_overall": result["rank_overall"],
            "trend": result["trend"],
            "window": [result["window_start"], result["window_end"]],
            "heatmap": [grid.ranks.tolist(), grid.steps.tolist(), grid.values.round(7).tolist()],
        }
    )


def _record_builds(monkeypatch: pytest.MonkeyPatch) -> list[WindowOps]:
    """Every window the passes build, in order."""
    built: list[WindowOps] = []

    def recording(**kwargs: Any) -> WindowOps:
        out = window_ops(**kwargs)
        built.append(out)
        return out

    monkeypatch.setattr(analysis, "window_ops", recording)
    return built


def _record_slides(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For every window analysis given the engine's kept state: whether it slid (the cold
    passes' analyses, given none, are not listed)."""
    slid: list[bool] = []
    real = batches.slide

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        slid.append(out is not None)
        return out

    monkeypatch.setattr(batches, "slide", recording)
    return slid


@pytest.mark.parametrize("chunk", [10_000, 4], ids=["cold-whole", "cold-in-chunks"])
def test_incremental_passes_match_cold_passes(
    db: Database, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Pushes of 1 to 9 steps, rank 3 a push behind the others (its newest steps arrive late),
    a 30-step window sliding through a straggler's onset and end: after every push, the pass on
    the kept table equals the pass from scratch."""
    monkeypatch.setattr(window_reader, "COLD_CHUNK_STEPS", chunk)
    monkeypatch.setattr(window_reader, "WHOLE_READ_RECORDS", 0)  # chunked however small
    settings: Settings = server_settings(db.url, analysis_window_steps=WINDOW, warmup_steps=3)
    cache = WindowCache(256 * 1024 * 1024)
    monkeypatch.setattr(window_cache, "_cache", cache)
    built = _record_builds(monkeypatch)
    slid = _record_slides(monkeypatch)
    job_id = f.new_job_id("window")
    origin, step = f.T0, 0
    held: list[pb.StepRecord] = []  # rank 3's records not sent yet
    incremental_passes = 0
    for seq, count in enumerate([5, 1, 9, 2, 7, 3, 8, 4, 6, 9, 9, 1, 5, 8, 2, 7], start=1):
        records, origin = _steps(step, count, origin)
        step += count
        batches = [f.batch(job_id, r, RANKS, seq=seq, steps=records[r]) for r in range(3)]
        batches.append(f.batch(job_id, 3, RANKS, seq=seq, steps=held))
        held = records[3]
        store_batches(db, batches, now=origin + 1)
        with db.session() as session:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            kept = analysis.analyze_job(session=session, job=job, settings=settings, now=origin + 2)
            incremental_passes += int(built[-1].incremental)
            monkeypatch.setattr(window_cache, "_cache", None)
            cold_settings = settings.model_copy(update={"analysis_cache_mb": 0})
            cold = analysis.analyze_job(session=session, job=job, settings=cold_settings, now=origin + 2)
            monkeypatch.setattr(window_cache, "_cache", cache)
        assert _comparable(kept) == _comparable(cold), f"after step {step - 1}"
    assert incremental_passes == 14  # all but the first two (rank 3 joins with the second)
    # The engine laid out only the new steps on most of them (whatif/incremental.py); not when a
    # slot came or went (the checkpoint at step 25, host gaps every 7th step) or the main-stream
    # order moved, nor on cold builds: then the window was built whole, with the same answer.
    assert len(slid) == incremental_passes and incremental_passes // 2 <= sum(slid) < len(slid), slid
    assert kept["summary"]["to_step"] == step - 1 - 7  # rank 3's newest push is still in flight
    # The checkpoint's op type (step 25) slid out of the window.
    assert "checkpoint" not in kept["summary"]["attribution"]["by_op_type"]


def test_a_restart_rebuilds_the_window(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank restarted under a new agent re-runs steps it had reported: the kept table is not
    used, and the pass matches one from scratch."""
    settings: Settings = server_settings(db.url, analysis_window_steps=WINDOW, warmup_steps=2)
    monkeypatch.setattr(window_cache, "_cache", WindowCache(256 * 1024 * 1024))
    built = _record_builds(monkeypatch)
    job_id = f.new_job_id("window")
    records, origin = _steps(0, 40, f.T0)
    write_batches(
        db,
        [validate_batch(f.batch(job_id, r, RANKS, steps=records[r]), Limits()) for r in range(RANKS)],
        now=origin,
    )
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        analysis.analyze_job(session=session, job=job, settings=settings, now=origin)
    # Every rank restarts from its checkpoint at step 30, under new agent ids, and runs on.
    again, origin = _steps(30, 25, origin + 5)
    batches = [
        f.batch(job_id, r, RANKS, steps=again[r], agent_id=f"restarted-{job_id}-{r}") for r in range(RANKS)
    ]
    store_batches(db, batches, now=origin)
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        kept = analysis.analyze_job(session=session, job=job, settings=settings, now=origin)
        monkeypatch.setattr(window_cache, "_cache", None)
        cold_settings = settings.model_copy(update={"analysis_cache_mb": 0})
        cold = analysis.analyze_job(session=session, job=job, settings=cold_settings, now=origin)
    assert not built[1].incremental
    assert _comparable(kept) == _comparable(cold)
    assert kept["summary"]["to_step"] == 54


def test_a_cold_build_in_chunks_matches_one_read_whole(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window read and built a few steps at a time (as big windows are) gives the table one
    read gives: chunk edges falling anywhere, a step one rank never sent in the middle (dropped
    by its agent), and the newest steps not complete yet."""
    settings: Settings = server_settings(db.url, analysis_window_steps=60, warmup_steps=3)
    monkeypatch.setattr(window_cache, "_cache", None)
    settings = settings.model_copy(update={"analysis_cache_mb": 0})
    job_id = f.new_job_id("chunks")
    records, origin = _steps(0, 90, f.T0)
    records[1] = [r for r in records[1] if r.step != 47]  # lost
    records[3] = records[3][:-2]  # in flight
    batches = [f.batch(job_id, r, RANKS, steps=records[r]) for r in range(RANKS)]
    store_batches(db, batches, now=origin)
    results = []
    for chunk in (10_000, 7, 3):
        monkeypatch.setattr(window_reader, "COLD_CHUNK_STEPS", chunk)
        monkeypatch.setattr(window_reader, "WHOLE_READ_RECORDS", 0)  # chunked however small
        with db.session() as session:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            results.append(
                _comparable(analysis.analyze_job(session=session, job=job, settings=settings, now=origin))
            )
    assert results[0] == results[1] == results[2]
    summary = results[0]["summary"]
    assert (summary["from_step"], summary["to_step"], summary["steps_seen"]) == (30, 87, 57)


def test_a_kept_table_serves_only_its_own_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two databases holding a job of the same id, keys and restarts (a process serving both, as
    tests do): each is analysed from its own records."""
    monkeypatch.setattr(window_cache, "_cache", WindowCache(256 * 1024 * 1024))
    named = []
    for slow in (1, 2):
        database = Database(f"sqlite:///{tmp_path}/twin-{slow}.db")
        migrate.upgrade(database)
        records = f.dp_job_steps(RANKS, range(40), slow_rank=slow, slow_forward=0.020)
        batches = [f.batch("twin", r, RANKS, steps=records[r]) for r in range(RANKS)]
        store_batches(database, batches, now=f.T0 + 10)
        settings = server_settings(database.url, warmup_steps=2)
        with database.session() as session:
            job = session.get(Job, ("twin", 1))
            assert job is not None and job.key == 1
            summary = analysis.analyze_job(session=session, job=job, settings=settings, now=f.T0 + 10)[
                "summary"
            ]
        named.append([s["rank"] for s in summary["stragglers"]])
        database.dispose()
    assert named == [[1], [2]]


def _rows_outside(ops: OpTable | None, skip: list[tuple[int, int]]) -> OpTable | None:
    """What the pass did before window_ops took `skip`: the whole table, then a copy without them."""
    if ops is None:
        return None
    outside = np.ones(ops.step.shape, dtype=bool)
    for lo, hi in skip:
        outside &= (ops.step < lo) | (ops.step >= hi)
    return ops.take(outside) if outside.any() else None


def _same_table(a: OpTable | None, b: OpTable | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.op_types == b.op_types and all(
        np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True) for name in OpTable.COLUMNS
    )


@pytest.mark.parametrize("chunk", [10_000, 4], ids=["cold-whole", "cold-in-chunks"])
def test_skipped_steps_give_the_table_without_their_rows(
    db: Database, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Steps left out as each piece is built (warm-up), pass after pass, kept or cold, give the
    table the whole window gives with their rows taken out afterwards, to the bit: the same rows
    and the same op types (the checkpoint of step 25, a skipped step, stays listed until step 25
    slides out of the window, and goes then)."""
    monkeypatch.setattr(window_reader, "COLD_CHUNK_STEPS", chunk)
    monkeypatch.setattr(window_reader, "WHOLE_READ_RECORDS", 0)  # chunked however small
    skip = [(0, 3), (20, 30), (52, 55)]
    kept_skipping, kept_whole = WindowCache(256 << 20), WindowCache(256 << 20)
    job_id = f.new_job_id("skip")
    origin, step = f.T0, 0
    checked = listed = 0
    for seq, count in enumerate([5, 9, 2, 7, 8, 4, 6, 9, 9, 1, 5, 8], start=1):
        records, origin = _steps(step, count, origin)
        step += count
        batches = [f.batch(job_id, r, RANKS, seq=seq, steps=records[r]) for r in range(RANKS)]
        store_batches(db, batches, now=origin + 1)
        with db.session() as session:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            lo, hi = resolve_window(session=session, job=job, window=StepWindow(), default_last=WINDOW)
            common: dict[str, Any] = {"session": session, "job": job, "lo": lo, "hi": hi, "key": "k"}
            for cache_a, cache_b in ((kept_skipping, kept_whole), (None, None)):
                got = window_ops(**common, cache=cache_a, skip=skip)
                whole = window_ops(**common, cache=cache_b)
                assert _same_table(got.ops, _rows_outside(whole.ops, skip)), f"after step {step - 1}"
                assert got.times == whole.times
                checked += 1
            if any(s == 25 for s, _, _ in got.times):
                assert got.ops is not None and "checkpoint" in got.ops.op_types
                assert not (got.ops.step == 25).any()
                listed += 1
    assert checked == 24 and listed >= 2
    assert got.ops is not None and "checkpoint" not in got.ops.op_types


def test_a_cold_build_chunks_the_steps_that_exist(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps numbered by samples (every 1,000th) and then far ahead (a jump of 10^12, as a
    fuzzed or restored job may send): the chunked build reads one chunk per `COLD_CHUNK_STEPS`
    steps that exist, not one per that many step numbers (10^10 chunks, an out-of-memory kill
    before), and gives the table one read gives."""
    settings: Settings = server_settings(db.url, analysis_window_steps=60, warmup_steps=3)
    monkeypatch.setattr(window_cache, "_cache", None)
    settings = settings.model_copy(update={"analysis_cache_mb": 0})
    job_id = f.new_job_id("sparse")
    records, origin = _steps(0, 70, f.T0)
    numbers = [1000 * i if i < 50 else 10**12 + 1000 * i for i in range(70)]
    for recs in records.values():
        for rec in recs:
            rec.step = numbers[rec.step]
    batches = [f.batch(job_id, r, RANKS, steps=records[r]) for r in range(RANKS)]
    store_batches(db, batches, now=origin)
    reads: list[tuple[int | None, int | None]] = []
    real_read = window_reader.read_window

    def counted(**kwargs: Any) -> Any:
        reads.append((kwargs.get("from_step"), kwargs.get("to_step")))
        return real_read(**kwargs)

    monkeypatch.setattr(window_reader, "read_window", counted)
    results = []
    for chunk in (10_000, 8):
        monkeypatch.setattr(window_reader, "COLD_CHUNK_STEPS", chunk)
        monkeypatch.setattr(window_reader, "WHOLE_READ_RECORDS", 0)  # chunked however small
        reads.clear()
        with db.session() as session:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            results.append(
                _comparable(analysis.analyze_job(session=session, job=job, settings=settings, now=origin))
            )
    assert results[0] == results[1]
    assert len(reads) == math.ceil(61 / 8)  # 60 window steps and the one before them
    summary = results[0]["summary"]
    assert (summary["from_step"], summary["to_step"]) == (numbers[10], numbers[69])


def test_each_chunk_is_read_once_and_converted_once(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window goes one way: a cold pass reads each chunk once and converts it once (on
    PostgreSQL the next chunk is read while one is converted), and the next pass reads and
    converts the new steps once (store/window_reader.py, then whatif/inputs/step_table.py)."""
    settings: Settings = server_settings(db.url, analysis_window_steps=60, warmup_steps=3)
    monkeypatch.setattr(window_cache, "_cache", WindowCache(64 << 20))
    monkeypatch.setattr(window_reader, "COLD_CHUNK_STEPS", 8)
    monkeypatch.setattr(window_reader, "WHOLE_READ_RECORDS", 0)  # chunked however small
    calls: list[str] = []
    real_read, real_convert = window_reader.read_window, window_ops_module.convert

    def read(**kwargs: Any) -> Any:
        calls.append(f"read {kwargs['from_step']}..{kwargs['to_step']}")
        return real_read(**kwargs)

    def convert(*args: Any, **kwargs: Any) -> Any:
        calls.append("convert")
        return real_convert(*args, **kwargs)

    monkeypatch.setattr(window_reader, "read_window", read)
    monkeypatch.setattr(window_ops_module, "convert", convert)
    job_id = f.new_job_id("oneway")
    records, origin = _steps(0, 70, f.T0)
    write_batches(
        db,
        [validate_batch(f.batch(job_id, r, RANKS, steps=records[r]), Limits()) for r in range(RANKS)],
        now=origin,
    )
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        analysis.analyze_job(session=session, job=job, settings=settings, now=origin)
    chunks = math.ceil(61 / 8)  # 60 window steps and the one before
    reads = [c for c in calls if c.startswith("read")]
    assert len(reads) == len(set(reads)) == calls.count("convert") == chunks
    calls.clear()
    more, origin = _steps(70, 5, origin)
    write_batches(
        db,
        [validate_batch(f.batch(job_id, r, RANKS, seq=2, steps=more[r]), Limits()) for r in range(RANKS)],
        now=origin,
    )
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        analysis.analyze_job(session=session, job=job, settings=settings, now=origin)
    assert calls == ["read 69..74", "convert"]  # from the newest kept step on
