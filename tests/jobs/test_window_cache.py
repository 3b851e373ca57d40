"""The window cache's eviction: passes that cycle over more jobs than fit keep the share that fits
warm (least-recently-used would evict exactly the job the pass needs next); jobs no pass asks for
any more give way."""

from __future__ import annotations

from typing import Any

import pytest

from smon_server.jobs import window_cache
from smon_server.jobs.window_cache import Kept, WindowCache
from smon_server.settings import Settings


class _Sized:
    nbytes = 100


def _kept() -> Any:
    return Kept(key=None, table=_Sized(), workers=_Workers(), last_seen=_Workers())  # type: ignore[arg-type]


class _Workers:
    size = 0


def _cycle(cache: WindowCache, jobs: int, passes: int) -> float:
    hits = total = 0
    for _ in range(passes):
        for j in range(jobs):
            job = (f"job-{j}", 1)
            total += 1
            hits += cache.get(job, None) is not None
            cache.put(job, _kept())
    return hits / total


def test_passes_over_more_jobs_than_fit_keep_most_of_those_that_fit() -> None:
    cache = WindowCache(370 * 100)
    assert _cycle(cache, 500, 10) > 0.6  # least-recently-used: 0
    assert len(cache) == 370


def test_jobs_no_longer_analysed_give_way() -> None:
    cache = WindowCache(3 * 100)
    _cycle(cache, 3, 2)
    for j in range(3, 6):  # three new jobs, analysed twice: the old three are not asked for
        for _ in range(2):
            cache.get((f"job-{j}", 1), None)
            cache.put((f"job-{j}", 1), _kept())
    assert all(cache.get((f"job-{j}", 1), None) is not None for j in range(3, 6))


def test_all_jobs_fit_all_stay() -> None:
    assert _cycle(WindowCache(10 * 100), 10, 5) == 0.8  # every pass but the first


def test_the_default_budget_gives_the_small_jobs_workers_a_third_and_the_big_jobs_an_eighth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory = 16 << 30
    monkeypatch.setattr(
        window_cache.os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else memory // 4096
    )
    settings = Settings(database_url="postgresql+psycopg://x/y", analysis_workers=2)
    assert window_cache.cache_bytes(settings) == memory // 3 // 2
    assert window_cache.cache_bytes(settings, big_jobs=True) == memory // 8
    one = settings.model_copy(update={"analysis_workers": 1})
    assert window_cache.cache_bytes(one) == memory // 3
    assert (
        window_cache.cache_bytes(one.model_copy(update={"analysis_cache_mb": 300}), big_jobs=True)
        == 300 << 20
    )


def test_the_engine_state_counts_in_a_kept_window() -> None:
    kept = _kept()
    alone = kept.nbytes
    kept.engine.kept = _Sized()
    assert kept.nbytes == alone + _Sized.nbytes


class _Counted:
    """A table that counts how often its size is read."""

    reads = 0

    @property
    def nbytes(self) -> int:
        _Counted.reads += 1
        return 100


def test_keeping_a_window_reads_its_own_size_only_and_counts_engine_state_set_after() -> None:
    cache = WindowCache(10 * 100)
    for j in range(5):
        cache.put((f"job-{j}", 1), Kept(key=None, table=_Counted(), workers=_Workers(), last_seen=_Workers()))  # type: ignore[arg-type]
    before = _Counted.reads
    cache.put(("job-5", 1), Kept(key=None, table=_Counted(), workers=_Workers(), last_seen=_Workers()))  # type: ignore[arg-type]
    assert _Counted.reads - before <= 2  # its own size, not the five kept ones' (O(jobs) a put)
    assert cache.nbytes == 600
    # The pass sets the engine's state after the window was kept: it counts from then on...
    kept = cache.get(("job-0", 1), None)
    assert kept is not None and cache.nbytes == 500
    cache.put(("job-0", 1), kept)
    kept.engine.kept = _Sized()  # type: ignore[assignment]
    assert cache.nbytes == 700
    kept.engine.kept = None
    assert cache.nbytes == 600
    kept.engine.kept = _Sized()  # type: ignore[assignment]
    # ... and evicts others when the budget is passed: 700 + 4 × 100 > 1,000.
    for j in range(6, 10):
        cache.put((f"job-{j}", 1), _kept())
    assert cache.nbytes <= 1000 and len(cache) == 9
    # A window taken out no longer counts, whatever the pass then sets in its slot.
    taken = cache.get(("job-0", 1), None)
    assert taken is not None and taken.engine.nbytes == 100
    held = cache.nbytes
    taken.engine.kept = None
    assert cache.nbytes == held
