"""Phase heatmaps served from the columns the analysis pass stores (store/phase_grids.py) equal the
grid computed straight from the stored step records, cell for cell, pass after pass: windows
sliding, a rank a push behind (its steps stored partial, then whole), GC spans of kind `gc`, a
phase on one step only, host work, restarts, and zooms by rank and by step."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from smon.v1 import ingest_pb2 as pb
from smon_server.grid import Grid
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.jobs import analysis, phase_heatmap, window_cache
from smon_server.jobs.window_cache import WindowCache
from smon_server.settings import Settings
from smon_server.store import migrate, phase_grids, queries, window_reader
from smon_server.store.db import Database
from smon_server.store.models import Job, PhaseColumn
from smon_server.store.queries import StepWindow
from smon_server.store.step_window import read_window
from smon_server.store.writes import write_batches
from tests.jobs.test_window_ops import RANKS, WINDOW, _steps
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.support.stored import store_batches

METRICS = ("step_time", "forward", "backward", "gc", "other", "checkpoint", "grad_sync", "data_wait", "nope")


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    migrate.upgrade(database)
    yield database
    database.dispose()


def direct(db: Database, job_id: str, metric: str, lo: int | None, hi: int | None) -> Grid:
    """The grid from the stored records, computed here without the stored columns."""
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        records = read_window(session=session, job=job, from_step=lo, to_step=hi)
    ranks, ri = np.unique(records.rank, return_inverse=True)
    steps, si = np.unique(records.step, return_inverse=True)
    values = np.full((ranks.size, steps.size), np.nan, dtype=np.float32)
    values[ri, si] = records.duration if metric == "step_time" else records.phase_seconds(metric)
    return Grid(ranks, steps, values)


def served(db: Database, job_id: str, metric: str, window: StepWindow, **zoom: int | None) -> Grid:
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        return phase_heatmap.phase_heatmap(
            session=session, job=job, metric=metric, window=window, default_last=WINDOW, **zoom
        )


def assert_same(a: Grid, b: Grid, what: str) -> None:
    assert a.ranks.tolist() == b.ranks.tolist(), what
    assert a.steps.tolist() == b.steps.tolist(), what
    assert a.values.dtype == b.values.dtype == np.float32, what
    np.testing.assert_array_equal(a.values, b.values, err_msg=what)  # bit for bit, NaN in place


def analyse_and_store(db: Database, job_id: str, settings: Settings, now: float) -> dict:
    """One pass as the loop runs it: analyse, then store in the job's transaction."""
    with db.transaction() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        result = analysis.analyze_job(session=session, job=job, settings=settings, now=now)
        assert result["phase_columns"] is not None
        phase_grids.write(session, job.key, result["phase_columns"])
    return result


def stored_steps(db: Database, job_id: str) -> tuple[int, int] | None:
    with db.session() as session:
        key = queries.job_key(session=session, job_id=job_id)
        assert key is not None
        return phase_grids.stored_range(session, key)


@pytest.mark.parametrize("chunk", [10_000, 4], ids=["cold-whole", "cold-in-chunks"])
def test_stored_phase_grids_equal_the_records_pass_after_pass(
    db: Database, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(window_reader, "COLD_CHUNK_STEPS", chunk)
    monkeypatch.setattr(window_reader, "WHOLE_READ_RECORDS", 0)  # chunked however small
    settings: Settings = server_settings(db.url, analysis_window_steps=WINDOW, warmup_steps=3)
    monkeypatch.setattr(window_cache, "_cache", WindowCache(256 * 1024 * 1024))
    job_id = f.new_job_id("phases")
    origin, step = f.T0, 0
    held: list[pb.StepRecord] = []  # rank 3's records, sent one push late
    for seq, count in enumerate([5, 1, 9, 2, 7, 3, 8, 4, 6, 9, 9, 1, 5, 8], start=1):
        records, origin = _steps(step, count, origin)
        step += count
        batches = [f.batch(job_id, r, RANKS, seq=seq, steps=records[r]) for r in range(3)]
        batches.append(f.batch(job_id, 3, RANKS, seq=seq, steps=held))
        held = records[3]
        store_batches(db, batches, now=origin + 1)
        analyse_and_store(db, job_id, settings, origin + 2)
        with db.session() as session:
            job = queries.get_job(session=session, job_id=job_id)
            assert job is not None
            lo, hi = queries.resolve_window(
                session=session, job=job, window=StepWindow(), default_last=WINDOW
            )
        assert stored_steps(db, job_id) == (lo, hi)  # the pass's window, no more
        for metric in METRICS:
            assert_same(served(db, job_id, metric, StepWindow()), direct(db, job_id, metric, lo, hi), metric)
    assert hi is not None and lo is not None
    # Zooms: ranks (only their bytes are read), steps inside the window, and ranges reaching
    # before it and past it (those steps come from the records).
    for metric in ("forward", "gc", "other", "step_time"):
        for a, b in ((1, 2), (3, 3), (0, 0), (2, None), (None, 1)):
            want = direct(db, job_id, metric, lo, hi)
            keep = (want.ranks >= (a or 0)) & (want.ranks <= (b if b is not None else 10**9))
            want = Grid(want.ranks[keep], want.steps, want.values[keep])
            got = served(db, job_id, metric, StepWindow(), from_rank=a, to_rank=b)
            assert_same(got, want, f"{metric} ranks {a}..{b}")
        for a, b in ((lo + 3, hi - 2), (lo - 12, lo + 4), (hi - 3, hi + 40), (0, 10**6), (lo - 5, None)):
            got = served(db, job_id, metric, StepWindow(from_step=a, to_step=b))
            assert_same(got, direct(db, job_id, metric, a, b), f"{metric} steps {a}..{b}")
        got = served(db, job_id, metric, StepWindow(last=WINDOW + 7), from_rank=2, to_rank=3)
        want = direct(db, job_id, metric, hi - WINDOW - 7 + 1, hi)
        keep = want.ranks >= 2
        assert_same(got, Grid(want.ranks[keep], want.steps, want.values[keep]), f"{metric} last")
    # The checkpoint phase (step 25 only) slid out of the window: its rows went with it.
    with db.session() as session:
        key = queries.job_key(session=session, job_id=job_id)
        assert key is not None
        codes = {
            c for (c,) in session.query(PhaseColumn.metric).filter(PhaseColumn.job_key == key).distinct()
        }
        assert phase_grids.metric_code(session, key, "checkpoint") not in codes
        assert {phase_grids.STEP_TIME, phase_grids.OTHER, phase_grids.GC} <= codes
        assert phase_grids.metric_code(session, key, "nope") == phase_grids.UNREPORTED


def test_a_restart_and_a_lost_pass_keep_the_grids_right(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks restarted under new agents re-run steps (the pass builds cold and rewrites every
    row); a pass whose rows were never stored (its transaction failed) leaves no gap: the next
    one stores what it read and drops what it cannot vouch for."""
    settings: Settings = server_settings(db.url, analysis_window_steps=WINDOW, warmup_steps=2)
    monkeypatch.setattr(window_cache, "_cache", WindowCache(256 * 1024 * 1024))
    job_id = f.new_job_id("restart")
    records, origin = _steps(0, 40, f.T0)
    write_batches(
        db,
        [validate_batch(f.batch(job_id, r, RANKS, steps=records[r]), Limits()) for r in range(RANKS)],
        now=origin,
    )
    analyse_and_store(db, job_id, settings, origin)
    again, origin = _steps(30, 25, origin + 5)
    batches = [
        f.batch(job_id, r, RANKS, steps=again[r], agent_id=f"restarted-{job_id}-{r}") for r in range(RANKS)
    ]
    store_batches(db, batches, now=origin)
    analyse_and_store(db, job_id, settings, origin)
    lo, hi = 55 - WINDOW, 54
    assert stored_steps(db, job_id) == (lo, hi)
    for metric in METRICS:
        assert_same(served(db, job_id, metric, StepWindow()), direct(db, job_id, metric, lo, hi), metric)

    # A pass analysed but not stored, then one that is: the second continues from steps the
    # first kept in memory, whose rows are not there.
    more, origin = _steps(55, 5, origin)
    batches = [
        f.batch(job_id, r, RANKS, seq=2, steps=more[r], agent_id=f"restarted-{job_id}-{r}")
        for r in range(RANKS)
    ]
    store_batches(db, batches, now=origin)
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        analysis.analyze_job(session=session, job=job, settings=settings, now=origin)  # not stored
    more, origin = _steps(60, 5, origin)
    batches = [
        f.batch(job_id, r, RANKS, seq=3, steps=more[r], agent_id=f"restarted-{job_id}-{r}")
        for r in range(RANKS)
    ]
    store_batches(db, batches, now=origin)
    analyse_and_store(db, job_id, settings, origin)
    first, last = stored_steps(db, job_id) or (None, None)
    assert last == 64 and first is not None and first > 65 - WINDOW  # shorter, never a gap
    for metric in ("forward", "other"):
        got = served(db, job_id, metric, StepWindow())
        assert got.steps.tolist() == list(range(first, 65))
        assert_same(got, direct(db, job_id, metric, first, 64), metric)
        # Asked for by range, the steps no row holds come from the records.
        got = served(db, job_id, metric, StepWindow(from_step=65 - WINDOW, to_step=64))
        assert_same(got, direct(db, job_id, metric, 65 - WINDOW, 64), metric)


def test_a_job_never_analysed_is_served_from_its_records(db: Database) -> None:
    job_id = f.new_job_id("raw")
    records, origin = _steps(0, 12, f.T0)
    write_batches(
        db,
        [validate_batch(f.batch(job_id, r, RANKS, steps=records[r]), Limits()) for r in range(RANKS)],
        now=origin,
    )
    assert stored_steps(db, job_id) is None
    for metric in ("forward", "step_time", "nope"):
        assert_same(served(db, job_id, metric, StepWindow()), direct(db, job_id, metric, 0, 11), metric)
        assert_same(
            served(db, job_id, metric, StepWindow(from_step=3, to_step=5), from_rank=1, to_rank=2),
            Grid(np.array([1, 2]), np.array([3, 4, 5]), direct(db, job_id, metric, 3, 5).values[1:3]),
            metric,
        )


def test_binary_copy_stores_the_rows_row_by_row_stored(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows a pass writes (binary COPY on PostgreSQL) are byte for byte the rows the
    row-by-row path made: every (metric, step), presence bits and float32 seconds; a second pass
    rewrites from its newest kept step on and keeps the window's older rows."""
    settings: Settings = server_settings(db.url, analysis_window_steps=WINDOW, warmup_steps=3)
    job_id = f.new_job_id("binary")
    origin = f.T0
    expected: dict[tuple[int, int], tuple[bytes | None, bytes]] = {}
    monkeypatch.setattr(window_cache, "_cache", WindowCache(64 << 20))
    for seq, count in enumerate((40, 6), start=1):
        records, origin = _steps(0 if seq == 1 else 40, count, origin)
        records[3] = records[3][:-1]  # rank 3's newest step in flight: that step is partial
        batches = [f.batch(job_id, r, RANKS, seq=seq, steps=records[r]) for r in range(RANKS)]
        store_batches(db, batches, now=origin)
        with db.transaction() as session:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            result = analysis.analyze_job(session=session, job=job, settings=settings, now=origin)
            update = result["phase_columns"]
            assert update is not None
            written = phase_grids.write(session, job.key, update)
            rows = phase_grids._rows(job.key, update)
            assert written == len(rows)
            low = update.rewrite_from if update.rewrite_from is not None else -(2**62)
            expected = {k: v for k, v in expected.items() if update.keep_from <= k[1] < low}
            expected.update({(m, step): (present, seconds) for _, m, step, present, seconds in rows})
        with db.session() as session:
            stored = {
                (int(r.metric), int(r.step)): (
                    None if r.present is None else bytes(r.present),
                    bytes(r.seconds),
                )
                for r in session.query(PhaseColumn).filter(PhaseColumn.job_key == job.key)
            }
        assert stored == expected
