"""The integer keys of committed job attempts and agents, kept by each server process so a group
whose jobs and agents are all known writes its step records before it upserts their rows.

Every group of a job upserts that job's one `jobs` row, and the row stays locked until the group
commits. Upserted first, as a new job's must be (its key goes into every step row), the lock is
held through the whole COPY: two ingest writers then take turns on a job instead of one building
its rows while the other's COPY runs. With the keys known, the COPY goes first and the rows are
locked only for the last statements before the commit. The upserts still return the keys; a key
that differs from the remembered one (a row deleted and made again) undoes the transaction, and
the group is written again without remembered keys.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from smon_server.store.rows import ValidBatch

JobKey = tuple[str, int]  # (job_id, attempt)
Keys = tuple[Mapping[JobKey, int], Mapping[str, int]]  # job attempts' keys, agents' keys


class StaleRowKeys(RuntimeError):
    """A remembered key no longer names its row; the transaction that used it is undone."""


class RowKeys:
    def __init__(self, limit: int = 500_000) -> None:
        self.limit = limit
        self._jobs: dict[JobKey, int] = {}
        self._agents: dict[str, int] = {}
        self._lock = threading.Lock()

    def lookup(self, batches: Sequence[ValidBatch]) -> tuple[dict[JobKey, int], dict[str, int]] | None:
        """Every batch's job attempt and agent key, or None if any is not known."""
        jobs: dict[JobKey, int] = {}
        agents: dict[str, int] = {}
        for b in batches:
            job = self._jobs.get((b.job_id, b.attempt))
            agent = self._agents.get(b.agent_id)
            if job is None or agent is None:
                return None
            jobs[(b.job_id, b.attempt)] = job
            agents[b.agent_id] = agent
        return jobs, agents

    def remember(self, jobs: Mapping[JobKey, int], agents: Mapping[str, int]) -> None:
        """Call once the transaction that stored these rows has committed."""
        with self._lock:
            if len(self._jobs) + len(self._agents) + len(jobs) + len(agents) > self.limit:
                self._jobs.clear()  # found again by the next upserts
                self._agents.clear()
            self._jobs.update(jobs)
            self._agents.update(agents)

    def check(self, used: Keys, stored: Keys) -> None:
        """Raise StaleRowKeys (forgetting every key) if a key used differs from the stored one."""
        jobs_stale = any(stored[0].get(name) != key for name, key in used[0].items())
        if jobs_stale or any(stored[1].get(name) != key for name, key in used[1].items()):
            with self._lock:
                self._jobs.clear()
                self._agents.clear()
            raise StaleRowKeys("a job or agent row was made again under a new key")
