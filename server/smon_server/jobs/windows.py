"""Analyses of step windows the pass has not stored, asked for through the API.

The pass stores each job's default window (jobs/loop.py); a dashboard that zooms into other steps
(`?from_step=`, `?to_step=`, `?window=`) needs an analysis of those. It runs where the pass's run:
in a spawned analysis process (jobs/workers.py), or, without worker processes (an in-memory
SQLite database), in a thread of this process. Never on the request's own time on the event loop,
and never with a job's lease: nothing is stored, so nothing is contended.

- **Bounded**: at most `IN_FLIGHT` windows are analysed at once; one more is refused (`Busy`, a
  503) rather than queued, so a dashboard left zooming cannot pile seconds of numpy on a server.
- **Cached**: the newest `KEEP` results, by job attempt, range and what new data would change
  (the job's last step, when it last saw one, its state). The same window asked again, by the
  same page's next poll or a colleague, is served from memory; a request that finds the window
  already being analysed waits for that analysis instead of starting another.
- **Timed**: a request waits `SMON_WINDOW_ANALYSIS_TIMEOUT` seconds at most (`TimedOut`, a 504
  that names the setting). The analysis goes on and is kept: asking again gets it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from smon_server.jobs import analysis, failures, refresh
from smon_server.jobs.workers import AnalysisWorkers
from smon_server.settings import Settings
from smon_server.store.db import DATABASE_UNAVAILABLE, Database
from smon_server.store.models import Job
from smon_server.store.queries import StepWindow

IN_FLIGHT = 2  # windows analysed at once, per server process (each may take a core and ~GBs)
KEEP = 16  # results kept (a 4,096-rank × 500-step heatmap is ~8 MB)
# What a window's analysis keeps: the views routes serve (not the pass's trend or phase columns).
VIEWS = ("state", "computed_at", "error", "error_at", "summary", "steps", "workers", "rank_overall")


class Busy(Exception):
    """As many windows as allowed are being analysed already."""


class TimedOut(Exception):
    """The window's analysis took longer than the request may wait (it goes on, and is kept)."""


class Gone(Exception):
    """The job attempt was deleted while its window was analysed."""


@dataclass(frozen=True)
class WindowKey:
    job_id: str
    attempt: int
    from_step: int | None
    to_step: int | None
    last: int | None
    # What new data changes: a window's numbers, or the state they are shown in.
    last_step: int | None
    last_step_seen: float | None
    state: str


class WindowAnalyses:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        workers: AnalysisWorkers | None,
        *,
        in_flight: int = IN_FLIGHT,
        keep: int = KEEP,
    ) -> None:
        self.settings = settings
        self.db = db
        self.workers = workers
        self.in_flight = in_flight
        self.keep = keep
        # Re-entrant: a future that fails at once runs its callback (which takes it) in place.
        self._lock = threading.RLock()
        self._running: dict[WindowKey, Future[dict[str, Any] | None]] = {}
        self._done: OrderedDict[WindowKey, dict[str, Any]] = OrderedDict()
        self._threads: ThreadPoolExecutor | None = None

    @property
    def timeout(self) -> float:
        return self.settings.window_analysis_timeout

    def analyse(self, session: Session, job: Job, window: StepWindow) -> dict[str, Any]:
        """The job attempt's analysis of `window` (the route's views, with `heatmap` the rank ×
        step slowdown grid), waiting `timeout` seconds at most. An analysis that fails on the
        job's data is answered as a failed one (served, not stored), as the pass stores its own.
        Raises Busy, TimedOut, Gone, or a DATABASE_UNAVAILABLE error."""
        now = time.time()
        state = refresh.current_state(
            session=session, job=job, stall_seconds=self.settings.stall_seconds, now=now
        )
        key = WindowKey(
            job_id=job.job_id,
            attempt=job.attempt,
            from_step=window.from_step,
            to_step=window.to_step,
            last=window.last,
            last_step=job.last_step,
            last_step_seen=job.last_step_seen,
            state=state.value,
        )
        with self._lock:
            kept = self._done.get(key)
            if kept is not None:
                self._done.move_to_end(key)
                return kept
            future = self._running.get(key)
            if future is None:
                if len(self._running) >= self.in_flight:
                    raise Busy(
                        f"{len(self._running)} analyses of other step windows are running, the most "
                        "one server runs at once; retry in a few seconds, or look at the stored window"
                    )
                future = self._submit(job.job_id, job.attempt, now, window)
                self._running[key] = future
                future.add_done_callback(lambda done: self._finished(key, done))
        try:
            result = future.result(timeout=self.timeout)
        except FutureTimeout:
            raise TimedOut(
                f"the analysis of this step window took longer than SMON_WINDOW_ANALYSIS_TIMEOUT "
                f"({self.timeout:g} s); it goes on and is kept: retry in a little while for its result"
            ) from None
        except DATABASE_UNAVAILABLE:
            raise
        except Exception as exc:  # this job's data broke its analysis: say so, as the stored one does
            return failures.failed_result(job, state.value, exc)
        if result is None:
            raise Gone(f"job {job.job_id!r} attempt {job.attempt} is gone")
        return _views(result)

    def _submit(
        self, job_id: str, attempt: int, now: float, window: StepWindow
    ) -> Future[dict[str, Any] | None]:
        """Called with the lock held."""
        if self.workers is not None:
            return self.workers.submit_window(job_id, attempt, now, window, processes=self.in_flight)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.in_flight, thread_name_prefix="smon-window")
        return self._threads.submit(self._analyse_here, job_id, attempt, now, window)

    def _analyse_here(
        self, job_id: str, attempt: int, now: float, window: StepWindow
    ) -> dict[str, Any] | None:
        """Without worker processes: in this process, on a thread of its own."""
        with self.db.session() as session:
            job = session.get(Job, (job_id, attempt))
            if job is None:
                return None
            return analysis.analyze_job(
                session=session, job=job, settings=self.settings, now=now, window=window
            )

    def _finished(self, key: WindowKey, future: Future[dict[str, Any] | None]) -> None:
        """Keep a successful result (failures are not kept: the next request tries again)."""
        result = None if future.cancelled() or future.exception() is not None else future.result()
        with self._lock:
            self._running.pop(key, None)
            if result is None:
                return
            self._done[key] = _views(result)
            while len(self._done) > self.keep:
                self._done.popitem(last=False)

    def close(self) -> None:
        with self._lock:
            threads, self._threads = self._threads, None
            self._done.clear()
        if threads is not None:
            threads.shutdown(wait=True, cancel_futures=True)


def _views(result: dict[str, Any]) -> dict[str, Any]:
    """What routes serve of an analysis, with its slowdown grid as `heatmap` (the stored name)."""
    return {**{name: result.get(name) for name in VIEWS}, "heatmap": result["rank_slowdown"]}
