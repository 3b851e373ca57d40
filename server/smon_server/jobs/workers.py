"""Analysis in worker processes.

A pass over a big job is seconds of numpy and Python. In the server's own process it would hold
the GIL that the gRPC ingest and the API need: acks would slow, agents' queues would fill. So each
job's analysis (read its window, build the op table, run the engine) runs in a pool of spawned
processes, each with its own database engine, and only the finished result comes back to be
stored. The job's lease stays with the server process that asked, for the whole analysis. Jobs are
analysed in parallel, one per worker.

Each job sticks to one worker (the least loaded when it was first seen), because a worker keeps
the jobs it analysed in memory between passes and reads only their new steps (jobs/window_ops.py);
how many workers analyse, a spare one taken while the replica falls behind, and when jobs move
between them: jobs/worker_shares.py. Jobs of `BIG_JOB_RANKS` ranks or more go to one more worker of their own,
started when the first such job is seen: a 4,096-rank job's pass takes seconds (its first after
a server start about ten), and on a worker shared with small jobs it would hold up their refresh
by that much every pass. A worker that dies (out of memory on a huge job, killed) fails that job's
analysis, not the server: the worker is started again, with an empty cache, and the job is tried
again at the next pass.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from smon_server.jobs.worker_shares import Change, JobKey, WorkerShares
from smon_server.settings import Settings
from smon_server.store.queries import StepWindow

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
# Per worker process, set by _start.
_state: dict[str, Any] = {}


def _start(settings: Settings, parent: int, big_jobs: bool = False, log_level: int = logging.WARNING) -> None:
    from smon_server.jobs.window_cache import serve_big_jobs
    from smon_server.store.db import Database

    # A spawned process starts with no logging set up: its INFO lines (a kept window rebuilt
    # whole) went nowhere. The server's level and format, on the same stderr.
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    if big_jobs:
        serve_big_jobs()  # its window cache's share (window_cache.cache_bytes)
    _state["settings"] = settings
    _state["db"] = Database.from_settings(settings)
    threading.Thread(target=_exit_with, args=(parent,), name="smon-parent-watch", daemon=True).start()


def _exit_with(parent: int) -> None:
    """A worker whose server was killed (SIGKILL, OOM killer: no shutdown code runs) would live
    on, holding memory and database connections: it leaves once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _analyze(
    job_id: str, attempt: int, now: float, window: StepWindow | None = None, cache_share: int | None = None
) -> tuple[int, float, dict[str, Any] | None]:
    """(this worker's pid, the seconds the analysis took here, the job attempt's analysis or None
    when it is gone). `window`: a step range asked for through the API (jobs/windows.py),
    analysed on its own, not the pass's. `cache_share`: the bytes this worker's window cache
    may keep now (it shrinks while the spare worker takes its share: jobs/worker_shares.py)."""
    from smon_server.jobs.analysis import analyze_job
    from smon_server.jobs.window_cache import process_cache
    from smon_server.store.models import Job

    started = time.perf_counter()
    if cache_share is not None:
        cache = process_cache(_state["settings"])
        if cache is not None:
            cache.max_bytes = cache_share  # what is over it is let go at the next put
    db = _state["db"]
    with db.session() as session:
        job = session.get(Job, (job_id, attempt))
        result = (
            None
            if job is None
            else analyze_job(session=session, job=job, settings=_state["settings"], now=now, window=window)
        )
    return os.getpid(), time.perf_counter() - started, result


def _drop(jobs: list[JobKey]) -> None:
    """Jobs moved to another worker: their kept windows here would only hold memory."""
    from smon_server.jobs.window_cache import process_cache

    cache = process_cache(_state["settings"])
    if cache is not None:
        for job in jobs:
            cache.drop(job)


# Jobs this big (world size) are analysed on a worker of their own (see above).
BIG_JOB_RANKS = 1024


def is_big(world_size: int | None) -> bool:
    return (world_size or 0) >= BIG_JOB_RANKS


class AnalysisWorkers:
    def __init__(self, settings: Settings, processes: int, spare: int = 0) -> None:
        self.settings = settings
        self.shares = WorkerShares(processes, spare)
        self.pids: set[int] = set()  # workers that returned a result (tests read it)
        self.last_change = Change()  # what the last pass's `adapt` decided (tests, benchmarks)
        self._split: list[float] | None = None  # each active slot's part of the cache, this pass
        # Slots 0..slots-1 for jobs below BIG_JOB_RANKS (the spare ones last), slot `slots` for
        # the big ones.
        self.slots = self.shares.slots
        self._pools: list[ProcessPoolExecutor | None] = [None] * (self.slots + 1)
        # Windows asked for through the API (jobs/windows.py) run in processes of their own,
        # started on first use: a dashboard's zoom neither waits behind the pass's queue nor
        # delays it, and they keep no window cache that the pass's workers would lose.
        self._windows: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> int:
        """Worker processes analysing the small jobs now (the spare counted while taken)."""
        return self.shares.active

    @property
    def spare_taken(self) -> bool:
        return self.shares.active > self.shares.base

    def _slot(self, job: JobKey, big: bool) -> tuple[int, ProcessPoolExecutor]:
        """The job's worker slot and its pool, chosen together: a pass running beside another
        (the demo's) never starts a pool for a slot the other just gave back."""
        with self._lock:
            slot = self.slots if big else self.shares.slot(job)
            return slot, self._executor(slot)

    def _executor(self, slot: int) -> ProcessPoolExecutor:
        """The slot's pool, started on first use (the caller holds the lock)."""
        pool = self._pools[slot]
        if pool is None:  # started on first use: a server that never analyses pays nothing
            pool = self._pools[slot] = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start,
                initargs=(
                    self.settings,
                    os.getpid(),
                    slot == self.slots,
                    logging.getLogger().getEffectiveLevel(),
                ),
            )
        return pool

    def analyze(self, job_id: str, attempt: int, now: float, *, big: bool = False) -> dict[str, Any] | None:
        """The job attempt's analysis, in its worker (`big`: a job of BIG_JOB_RANKS or more)."""
        key = (job_id, attempt)
        slot, pool = self._slot(key, big)
        share = None if big else self._cache_share(slot)
        try:
            pid, seconds, result = pool.submit(_analyze, job_id, attempt, now, None, share).result()
        except BrokenProcessPool:
            log.error("an analysis worker died while analysing job %s; restarting it", job_id)
            with self._lock:
                if self._pools[slot] is pool:
                    self._pools[slot] = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.pids.add(pid)
        if slot < self.slots:
            with self._lock:
                self.shares.ran(key, slot, seconds)
        return result

    def _cache_share(self, slot: int) -> int | None:
        """Bytes the slot's worker may keep now: its part of the small jobs' default third of
        memory (`cache_bytes` times the base workers), by the load of the jobs it holds, at least
        a quarter of an even split. A spare taking its share leaves the others less, and a worker
        still holding most jobs while they move keeps room for them. None when
        SMON_ANALYSIS_CACHE_MB sets it per process."""
        from smon_server.jobs.window_cache import cache_bytes

        if self.settings.analysis_cache_mb is not None:
            return None
        with self._lock:
            if self._split is None:  # once a pass (adapt resets it): loads() walks every job
                loads = self.shares.loads()
                whole = sum(loads)
                self._split = [x / whole if whole > 0 else 1 / len(loads) for x in loads]
            split = self._split
        part = split[slot] if slot < len(split) else 1 / len(split)
        total = cache_bytes(self.settings) * self.shares.base
        return int(total * max(part, 1 / (4 * len(split))))

    def adapt(self, interval: float, *, spare_ok: bool = True) -> Change:
        """After a pass: take or give back the spare worker (`spare_ok`: whether its core is free
        to take) and even out the workers' jobs (jobs/worker_shares.py); a worker's kept windows
        of jobs that left it are dropped, a given-back worker's process ends."""
        with self._lock:
            change = self.last_change = self.shares.adapt(interval, spare_ok=spare_ok)
            self._split = None
            retired = self._pools[change.retired] if change.retired is not None else None
            if change.retired is not None:
                self._pools[change.retired] = None
            pools = {slot: self._pools[slot] for slot in change.moved}
        if change.grown:
            log.warning(
                "analysis passes near the interval (%g s): taking a spare worker (%d analysing now)",
                interval,
                self.active,
            )
        if change.retired is not None:
            log.info(
                "analysis %s: giving back the spare worker (%d analysing now)",
                "keeps up" if spare_ok else "yields to ingest",
                self.active,
            )
        if retired is not None:
            retired.shutdown(wait=False, cancel_futures=True)
        for slot, jobs in change.moved.items():
            pool = pools[slot]
            if pool is not None and slot != change.retired:
                with contextlib.suppress(BrokenProcessPool, RuntimeError):
                    pool.submit(_drop, jobs)
        return change

    def submit_window(
        self, job_id: str, attempt: int, now: float, window: StepWindow, *, processes: int
    ) -> Future[dict[str, Any] | None]:
        """The job attempt's analysis of `window`, in one of `processes` processes kept for such
        requests; a process that dies fails that request (BrokenProcessPool) and is started again
        for the next."""
        with self._lock:
            pool = self._windows
            if pool is None:
                pool = self._windows = ProcessPoolExecutor(
                    processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start,
                    initargs=(self.settings, os.getpid(), False, logging.getLogger().getEffectiveLevel()),
                )
        done: Future[dict[str, Any] | None] = Future()

        def finished(ran: Future[tuple[int, float, dict[str, Any] | None]]) -> None:
            error = ran.exception()
            if error is None:
                done.set_result(ran.result()[2])
                return
            if isinstance(error, BrokenProcessPool):
                log.error("an analysis worker died while analysing a window of job %s; restarting it", job_id)
                with self._lock:
                    if self._windows is pool:
                        self._windows = None
                pool.shutdown(wait=False, cancel_futures=True)
            done.set_exception(error)

        try:
            pool.submit(_analyze, job_id, attempt, now, window).add_done_callback(finished)
        except BrokenProcessPool as exc:  # broken before this request: started again next time
            with self._lock:
                if self._windows is pool:
                    self._windows = None
            done.set_exception(exc)
        return done

    def forget(self, kept: set[JobKey]) -> None:
        """Only the job attempts in `kept` are still stored: the others' workers need not be kept."""
        with self._lock:
            self.shares.forget(kept)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = [*self._pools, self._windows], [None] * (self.slots + 1)
            self._windows = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
