"""Analysis in worker processes.

A pass over a big job is seconds of numpy and Python. In the server's own process it would hold
the GIL that the gRPC ingest and the API need: acks would slow, agents' queues would fill. So each
job's analysis (read its window, build the op table, run the engine) runs in a pool of spawned
processes, each with its own database engine, and only the finished result comes back to be
stored. The job's lease stays with the server process that asked, for the whole analysis. Jobs are
analysed in parallel, one per worker.

A worker that dies (out of memory on a huge job, killed) fails that job's analysis, not the server:
the pool is rebuilt and the job is tried again at the next pass.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from smon_server.settings import Settings

log = logging.getLogger(__name__)

# Per worker process, set by _start.
_state: dict[str, Any] = {}


def _start(settings: Settings) -> None:
    from smon_server.store.db import Database

    _state["settings"] = settings
    _state["db"] = Database(settings.database_url)


def _analyze(job_id: str, now: float) -> tuple[int, dict[str, Any] | None]:
    """(this worker's pid, the job's analysis, or None when the job is gone)."""
    from smon_server.jobs.analysis import analyze_job
    from smon_server.store.models import Job

    db = _state["db"]
    with db.session() as session:
        job = session.get(Job, job_id)
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


class AnalysisWorkers:
    def __init__(self, settings: Settings, processes: int) -> None:
        self.settings = settings
        self.processes = processes
        self.pids: set[int] = set()  # workers that returned a result (tests read it)
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:  # started on first use: a server that never analyses pays nothing
                self._pool = ProcessPoolExecutor(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start,
                    initargs=(self.settings,),
                )
            return self._pool

    def analyze(self, job_id: str, now: float) -> dict[str, Any] | None:
        pool = self._executor()
        try:
            pid, result = pool.submit(_analyze, job_id, now).result()
        except BrokenProcessPool:
            log.error("an analysis worker died while analysing job %s; restarting the pool", job_id)
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.pids.add(pid)
        return result

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
