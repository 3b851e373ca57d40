"""Facts about the analysis worker processes that the modules they run need too.

How many processes analyse (`default_processes`: the window cache divides memory by it; and
`spare_processes`, taken only while the replica falls behind) and what
a job's failure says when its process died (`WORKER_DIED`: the pass's retry rule reads it). They
live here, not in jobs/workers.py, because workers.py runs jobs/analysis.py in its processes: the
worker entry point imports the analysis, never the other way round.
"""

from __future__ import annotations

import os

from smon_server.settings import Settings

# Why a job's analysis failed when its worker died (jobs/failures.py): the first time it is tried
# again at the next pass (the worker may have been killed for another process's memory); dying
# again on the same job, it waits for new steps like any failure, so a job that takes its worker
# down does not do so every pass.
WORKER_DIED = "the analysis worker process died while analysing this job (out of memory, or killed)"
WORKER_DIED_AGAIN = WORKER_DIED + ", twice in a row"


def default_processes(settings: Settings) -> int:
    """SMON_ANALYSIS_WORKERS, or every core but one (left to ingest and the API), at least one. An
    in-memory SQLite database lives in the server process only: analysis stays there."""
    if settings.database_url.startswith("sqlite") and ":memory:" in settings.database_url:
        return 0
    if settings.analysis_workers is not None:
        return settings.analysis_workers
    return max(1, (os.cpu_count() or 2) - 1)


def spare_processes(settings: Settings) -> int:
    """Workers taken beyond `default_processes` while the replica falls behind
    (jobs/worker_shares.py): the last core, when SMON_ANALYSIS_WORKERS leaves the choice to SMon."""
    if settings.analysis_workers is not None or not default_processes(settings):
        return 0
    return 1 if (os.cpu_count() or 1) > 1 else 0
