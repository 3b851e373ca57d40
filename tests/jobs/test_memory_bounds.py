"""Analysis memory follows the records, never the numbers a client chose: a job whose steps are
10^12 apart, one whose window mixes small and huge step numbers, and jobs whose two ranks (or
stages) are numbered a million apart go through the whole pass (the window read, the kept facts,
the engine, the stored views and the heatmaps the API serves) in about the memory of the same
records numbered compactly."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import select

from smon.v1 import ingest_pb2 as pb
from smon_server.ingest.validate import MAX_WORLD_SIZE, Limits, validate_batch
from smon_server.jobs import analysis as job_analysis
from smon_server.jobs import phase_heatmap
from smon_server.settings import Settings
from smon_server.store import migrate
from smon_server.store.db import Database
from smon_server.store.models import Job
from smon_server.store.queries import StepWindow
from smon_server.store.writes import write_batches
from smon_server.views import heatmap as heatmaps
from tests.support import factories as f

RANKS, STEPS = 4, 80
FAR = MAX_WORLD_SIZE - 1  # the highest rank a batch may name


def _compact(i: int) -> int:
    return i


def _gaps(i: int) -> int:
    return i * 10**12


def _mixed(i: int) -> int:
    return i if i < STEPS // 2 else 10**12 + i * 7 * 10**11


def _store(
    db: Database, job: str, steps: Callable[[int], int], numbering: Callable[[pb.Batch, int], None]
) -> None:
    records = f.dp_job_steps(RANKS, [steps(i) for i in range(STEPS)], slow_rank=1, slow_forward=0.01)
    batches = []
    for rank in range(RANKS):
        b = f.batch(job, rank, RANKS, steps=records[rank])
        numbering(b, rank)
        batches.append(validate_batch(b, Limits()))
    write_batches(db, batches, now=time.time())


def _plain(b: pb.Batch, rank: int) -> None:
    pass


def _far_ranks(b: pb.Batch, rank: int) -> None:
    """Ranks 0, 1, 2 and the highest a world can have; DP ranks likewise."""
    b.coords.world_size = b.coords.dp_size = MAX_WORLD_SIZE
    if rank == RANKS - 1:
        b.coords.rank = b.coords.dp_rank = FAR


def _two_stages(b: pb.Batch, rank: int) -> None:
    """Two DP replicas of two pipeline stages."""
    b.coords.dp_rank, b.coords.pp_rank = rank % 2, rank // 2


def _far_stages(b: pb.Batch, rank: int) -> None:
    """The same, the stages numbered 0 and a million."""
    b.coords.world_size = MAX_WORLD_SIZE
    b.coords.dp_rank, b.coords.pp_rank = rank % 2, (rank // 2) * FAR
    b.coords.rank = rank if rank < 2 else FAR - 3 + rank


def _peak(db: Database, job_id: str) -> tuple[int, dict]:
    """Peak bytes traced over one whole analysis pass of the job and the views served from it."""
    # No warm-up: its length is counted in step numbers, which differ between the jobs compared.
    settings = Settings(database_url=db.url, analysis_cache_mb=0, warmup_steps=0)
    with db.session() as session:
        job = session.scalars(select(Job).where(Job.job_id == job_id)).one()
        tracemalloc.start()
        try:
            result = job_analysis.analyze_job(session=session, job=job, settings=settings, now=time.time())
            heatmaps.response_json(
                result["rank_slowdown"], job_id=job_id, metric="slowdown", max_ranks=512, max_steps=512
            )
            for metric in ("forward", "step_time", "other"):
                grid = phase_heatmap.phase_heatmap(
                    session=session, job=job, metric=metric, window=StepWindow(), default_last=500
                )
                heatmaps.response_json(grid, job_id=job_id, metric=metric, max_ranks=512, max_steps=512)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return peak, result


CASES = {
    "steps-1e12-apart": (_gaps, _plain, "compact"),
    "small-and-huge-steps": (_mixed, _plain, "compact"),
    "ranks-a-million-apart": (_compact, _far_ranks, "compact"),
    "stages-a-million-apart": (_gaps, _far_stages, "two-stages"),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, dict[str, int]]]:
    """Every job stored once, and the peak of each compactly numbered one's pass."""
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('memory') / 'smon.db'}")
    migrate.upgrade(db)
    _store(db, "compact", _compact, _plain)
    _store(db, "two-stages", _compact, _two_stages)
    for name, (steps, numbering, _) in CASES.items():
        _store(db, name, steps, numbering)
    _peak(db, "compact")  # the first pass imports and caches what every later one uses
    yield db, {}
    db.dispose()


@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_takes_the_memory_of_its_records_not_of_their_numbers(
    jobs: tuple[Database, dict[str, tuple[int, dict]]], case: str
) -> None:
    db, baselines = jobs
    steps, _, compact_job = CASES[case]
    if compact_job not in baselines:
        baselines[compact_job] = _peak(db, compact_job)
    compact, baseline = baselines[compact_job]
    odd, result = _peak(db, case)
    print(f"\npeak: compact {compact / 1e6:.1f} MB, odd numbers {odd / 1e6:.1f} MB")
    # The same analysis: every complete step, the same slowdown (a window whose step numbers
    # jump from small to huge analyses each run of evenly numbered steps).
    if steps is not _mixed:
        assert result["summary"]["steps_seen"] == baseline["summary"]["steps_seen"] > 0
        assert result["summary"]["slowdown"] == pytest.approx(baseline["summary"]["slowdown"], rel=1e-6)
    assert result["summary"]["steps_seen"] > 0 and result["summary"]["slowdown"] > 1.0
    assert odd <= 1.5 * compact + 1e6
