"""The window cache's eviction: passes that cycle over more jobs than fit keep the share that fits
warm (least-recently-used would evict exactly the job the pass needs next); jobs no pass asks for
any more give way."""

from __future__ import annotations

from typing import Any

from smon_server.jobs.window_cache import Kept, WindowCache


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
