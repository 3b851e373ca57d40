"""Analysis in worker processes.

A pass over a big job is seconds of numpy and Python. In the server's own process it would hold
the GIL that the gRPC ingest and the API need: acks would slow, agents' queues would fill. So each
job's analysis (read its window, build the op table, run the engine) runs in a pool of spawned
processes, each with its own database engine, and only the finished result comes back to be
stored. The job's lease stays with the server process that asked, for the whole analysis. Jobs are
analysed in parallel, one per worker.

Each job sticks to one worker (the one with the fewest jobs when it was first seen), because a
worker keeps the jobs it analysed in memory between passes and reads only their new steps
(jobs/window_ops.py). Jobs of `BIG_JOB_RANKS` ranks or more go to one more worker of their own,
started when the first such job is seen: a 4,096-rank job's pass takes seconds (its first after
a server start about ten), and on a worker shared with small jobs it would hold up their refresh
by that much every pass. A worker that dies (out of memory on a huge job, killed) fails that job's
analysis, not the server: the worker is started again, with an empty cache, and the job is tried
again at the next pass.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from smon_server.settings import Settings
from smon_server.store import attempts

log = logging.getLogger(__name__)

# Why a job's analysis failed when its worker died (jobs/failures.py): the first time it is tried
# again at the next pass (the worker may have been killed for another process's memory); dying
# again on the same job, it waits for new steps like any failure, so a job that takes its worker
# down does not do so every pass.
WORKER_DIED = "the analysis worker process died while analysing this job (out of memory, or killed)"
WORKER_DIED_AGAIN = WORKER_DIED + ", twice in a row"

# Per worker process, set by _start.
_state: dict[str, Any] = {}


def _start(settings: Settings, parent: int) -> None:
    from smon_server.store.db import Database

    _state["settings"] = settings
    _state["db"] = Database.from_settings(settings)
    threading.Thread(target=_exit_with, args=(parent,), name="smon-parent-watch", daemon=True).start()


def _exit_with(parent: int) -> None:
    """A worker whose server was killed (SIGKILL, OOM killer: no shutdown code runs) would live
    on, holding memory and database connections: it leaves once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _analyze(job_id: str, attempt: int, now: float) -> tuple[int, dict[str, Any] | None]:
    """(this worker's pid, the job attempt's analysis, or None when it is gone)."""
    from smon_server.jobs.analysis import analyze_job
    from smon_server.store.models import Job

    db = _state["db"]
    with db.session() as session:
        job = session.get(Job, (job_id, attempt))
        result = (
            None
            if job is None
            else analyze_job(session=session, job=job, settings=_state["settings"], now=now)
        )
    return os.getpid(), result


def default_processes(settings: Settings) -> int:
    """SMON_ANALYSIS_WORKERS, or every core but one (left to ingest and the API), at least one. An
    in-memory SQLite database lives in the server process only: analysis stays there."""
    if settings.database_url.startswith("sqlite") and ":memory:" in settings.database_url:
        return 0
    if settings.analysis_workers is not None:
        return settings.analysis_workers
    return max(1, (os.cpu_count() or 2) - 1)


# Jobs this big (world size) are analysed on a worker of their own (see above).
BIG_JOB_RANKS = 1024


def is_big(world_size: int | None) -> bool:
    return (world_size or 0) >= BIG_JOB_RANKS


class AnalysisWorkers:
    def __init__(self, settings: Settings, processes: int) -> None:
        self.settings = settings
        self.processes = processes
        self.pids: set[int] = set()  # workers that returned a result (tests read it)
        # Slots 0..processes-1 for jobs below BIG_JOB_RANKS, slot `processes` for the big ones.
        self._pools: list[ProcessPoolExecutor | None] = [None] * (processes + 1)
        self._owner: dict[str, int] = {}  # job attempt (attempts.name) -> the worker keeping its window
        self._lock = threading.Lock()

    def _slot(self, job_id: str, big: bool) -> int:
        with self._lock:
            slot = self._owner.get(job_id)
            if slot is None and big:
                slot = self._owner[job_id] = self.processes
            if slot is None:
                load = [0] * self.processes
                for owner in self._owner.values():
                    if owner < self.processes:
                        load[owner] += 1
                slot = self._owner[job_id] = load.index(min(load))
            return slot

    def _executor(self, slot: int) -> ProcessPoolExecutor:
        with self._lock:
            pool = self._pools[slot]
            if pool is None:  # started on first use: a server that never analyses pays nothing
                pool = self._pools[slot] = ProcessPoolExecutor(
                    1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start,
                    initargs=(self.settings, os.getpid()),
                )
            return pool

    def analyze(self, job_id: str, attempt: int, now: float, *, big: bool = False) -> dict[str, Any] | None:
        """The job attempt's analysis, in its worker (`big`: a job of BIG_JOB_RANKS or more)."""
        slot = self._slot(attempts.name(job_id, attempt), big)
        pool = self._executor(slot)
        try:
            pid, result = pool.submit(_analyze, job_id, attempt, now).result()
        except BrokenProcessPool:
            log.error("an analysis worker died while analysing job %s; restarting it", job_id)
            with self._lock:
                if self._pools[slot] is pool:
                    self._pools[slot] = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.pids.add(pid)
        return result

    def forget(self, names: set[str]) -> None:
        """Job attempts (attempts.name) no longer stored: their worker need not be kept."""
        with self._lock:
            for name in set(self._owner) - names:
                del self._owner[name]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, [None] * (self.processes + 1)
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
