"""This process's kept job windows: the op table of each job's last pass, to be extended by the
next one (jobs/window_ops.py says what may be kept, and when it is used), and what the engine
laid out of it (`EngineSlot`, whatif/incremental.py).

Memory is bounded by SMON_ANALYSIS_CACHE_MB over all jobs; the least recently analysed go first,
unless they were analysed since the job being kept was last: then the passes cycle over more jobs
than fit, and least-recently-used would evict exactly the job the pass needs next (a later pass
over 500 × 64-rank jobs with room for ~370 kept none and rebuilt every window cold). The job
being kept is dropped instead, so about the share that fits stays warm pass after pass.
Each analysis worker process has its own cache. This module only keeps: it reads and builds nothing.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from smon_server.jobs.processes import default_processes
from smon_server.settings import Settings
from smon_server.store.models import Job
from smon_server.store.queries import RankAgent
from smon_server.whatif.incremental import Reusable
from smon_server.whatif.inputs.step_table import StepTable


class EngineSlot:
    """What the engine kept of its last analysis of a kept window (whatif/incremental.py), set
    by the pass after the engine ran. It belongs to one table lineage: a window built cold gets
    a new, empty slot, so the engine never slides from steps that were read differently. The
    cache holding it hears of every change in its size (`watch`): the pass sets it after the
    window was kept."""

    def __init__(self) -> None:
        self._kept: Reusable | None = None
        self.watch: Callable[[EngineSlot, Reusable | None], None] | None = None

    @property
    def kept(self) -> Reusable | None:
        return self._kept

    @kept.setter
    def kept(self, value: Reusable | None) -> None:
        watch = self.watch
        if watch is None:
            self._kept = value
        else:
            watch(self, value)  # the cache sets it, under its lock

    @property
    def nbytes(self) -> int:
        return 0 if self._kept is None else self._kept.nbytes


@dataclass(frozen=True)
class Kept:
    """A job's window as the last pass left it."""

    key: Hashable  # what the table depends on beyond its steps (`cache_key`)
    table: StepTable
    workers: np.ndarray  # sorted worker ids (columns.worker_ids) of the records read
    last_seen: np.ndarray  # per worker, the newest step it reported
    engine: EngineSlot = field(default_factory=EngineSlot)
    # The window's step bounds when every step number between them had records: the next pass
    # looks only past them for the newest steps (store/queries.newest_window).
    span: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + 16 * self.workers.size + self.engine.nbytes


class WindowCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int], Kept] = OrderedDict()  # by (job_id, attempt)
        # When each job was last kept (a count of puts), and when each kept entry was.
        self._tick = 0
        self._last_put: dict[tuple[str, int], int] = {}
        self._put_at: dict[tuple[str, int], int] = {}
        # Bytes held: each entry's table and workers as measured when kept (they do not change),
        # and its engine slot's as the slot reports them. Summing every entry's size at every put
        # was O(jobs) a put: 125,000 table sizes a pass over 500 jobs (0.29 s of puts, 3 ms now).
        self._fixed: dict[tuple[str, int], int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def get(self, job: tuple[str, int], key: Hashable) -> Kept | None:
        """The job's kept window (taken out: the pass puts back what it ends with), if kept under `key`."""
        with self._lock:
            entry = self._pop(job)
        return entry if entry is not None and entry.key == key else None

    @property
    def nbytes(self) -> int:
        """Bytes the kept windows hold now."""
        with self._lock:
            return self._total

    def _pop(self, job: tuple[str, int]) -> Kept | None:
        entry = self._entries.pop(job, None)
        if entry is not None:
            entry.engine.watch = None
            self._total -= self._fixed.pop(job) + entry.engine.nbytes
        return entry

    def _set_engine(self, slot: EngineSlot, value: Reusable | None) -> None:
        with self._lock:
            held = slot.watch == self._set_engine  # not taken out or evicted meanwhile
            if held:
                self._total -= slot.nbytes
            slot._kept = value
            if held:
                self._total += slot.nbytes

    def held_key(self, job: tuple[str, int]) -> Hashable | None:
        """The key the job's window is kept under, if one is kept (left kept)."""
        with self._lock:
            entry = self._entries.get(job)
        return None if entry is None else entry.key

    def span(self, job: tuple[str, int], key: Hashable) -> tuple[int, int] | None:
        """The contiguous step bounds of the job's kept window, if kept under `key` (left kept)."""
        with self._lock:
            entry = self._entries.get(job)
        return entry.span if entry is not None and entry.key == key else None

    def put(self, job: tuple[str, int], entry: Kept) -> None:
        held, engine = entry.nbytes, entry.engine.nbytes
        if held > self.max_bytes:
            return
        fixed = held - engine
        with self._lock:
            self._pop(job)
            self._tick += 1
            previous = self._last_put.get(job)
            self._last_put[job] = self._put_at[job] = self._tick
            if len(self._last_put) > MAX_REMEMBERED:
                self._last_put = {j: self._put_at[j] for j in self._entries if j in self._put_at}
                self._last_put[job] = self._tick
            self._entries[job] = entry
            self._fixed[job] = fixed
            self._total += held
            entry.engine.watch = self._set_engine
            while self._total > self.max_bytes and len(self._entries) > 1:
                oldest = next(iter(self._entries))
                if previous is not None and self._put_at.get(oldest, 0) > previous:
                    self._pop(job)  # a cycle longer than what fits: keep the others
                    self._put_at.pop(job, None)
                    break
                self._pop(oldest)
                self._put_at.pop(oldest, None)

    def drop(self, job: tuple[str, int]) -> None:
        """Let the job's kept window go (the job moved to another worker)."""
        with self._lock:
            self._pop(job)
            self._put_at.pop(job, None)

    def __len__(self) -> int:
        return len(self._entries)


# Jobs whose last keeping the cache remembers at most (beyond those it keeps).
MAX_REMEMBERED = 65536


def cache_key(database: str, job: Job, agents: Sequence[RankAgent], restarts: Sequence[int]) -> Hashable:
    """What a kept table depends on beyond its steps. The database is part of it: a process may
    serve more than one (tests do), and job and agent keys are only unique within one."""
    return (database, job.key, job.world_size, tuple(sorted(a.key for a in agents)), tuple(restarts))


_cache: WindowCache | None = None
_big_jobs = False  # this process is the worker of the big jobs (jobs/workers.py)


def serve_big_jobs() -> None:
    """Called in the worker process of the big jobs before its first analysis: its cache's share."""
    global _big_jobs
    _big_jobs = True


def process_cache(settings: Settings) -> WindowCache | None:
    """This process's cache of job windows (each analysis worker process has its own)."""
    global _cache
    if settings.analysis_cache_mb == 0:
        return None
    if _cache is None:
        _cache = WindowCache(cache_bytes(settings, big_jobs=_big_jobs))
    return _cache


def cache_bytes(settings: Settings, *, big_jobs: bool = False) -> int:
    """SMON_ANALYSIS_CACHE_MB, or: a third of physical memory over the workers of the small
    jobs, and an eighth for the worker of the big jobs (started only when there is one). A
    64-rank × 500-step window keeps about 13 MB with its engine state (the table 11 MB with the
    room its columns keep to grow, the engine's layout 2 MB), so 500 such jobs on one worker need
    ~6.5 GB: a quarter of this 23.5 GB machine (5.9 GB) left ~45 of them out, rebuilt cold
    every pass: the later pass over the 500 took 30.3 s, with a third 21.2 s (docs/storage.md). A
    4,096-rank window keeps about 0.75 GB. While the spare worker is taken (jobs/worker_shares.py)
    the small jobs' third is split by the load each worker holds (jobs/workers.py), so the
    workers together keep about what they kept before."""
    if settings.analysis_cache_mb is not None:
        return settings.analysis_cache_mb * 1024 * 1024
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 8 << 30
    return memory // 8 if big_jobs else memory // 3 // max(1, default_processes(settings))
