"""Ingest limits, so one broken job (an agent in a tight loop, a misconfigured batch size, a
script that makes up a new job id per run or per step) cannot take the ingest capacity and the
storage every other job shares.

Per agent: a rate limit (AgentRates). Per token (ingest has one): how many distinct jobs may be
reporting at once (ActiveJobs).

A token bucket per agent_id, refilled at `records_per_second` and holding `burst_seconds` of that.
A batch the bucket covers goes through untouched. Past it, the agent may borrow up to one more
bucket: the batch is stored and its Ack carries `throttle_seconds` (the time to pay the debt back,
which well-behaved agents wait). An agent that ignores that and goes deeper gets its batches
refused (`rate_limited`) until the bucket refills.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_AGENTS = 200_000  # buckets kept; the least recently seen agents' are forgotten beyond this


@dataclass
class _Bucket:
    level: float
    at: float


class AgentRates:
    def __init__(
        self,
        records_per_second: float,
        burst_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = records_per_second
        self.capacity = records_per_second * burst_seconds
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, agent_id: str, records: int) -> float | None:
        """Seconds the agent should hold back (0: none) with the batch stored, or None: refuse it."""
        if self.rate <= 0 or records <= 0:
            return 0.0
        now = self.clock()
        bucket = self._buckets.pop(agent_id, None) or _Bucket(self.capacity, now)
        bucket.level = min(self.capacity, bucket.level + (now - bucket.at) * self.rate)
        bucket.at = now
        self._buckets[agent_id] = bucket
        if len(self._buckets) > MAX_AGENTS:
            self._buckets.popitem(last=False)
        if bucket.level - records < -self.capacity:
            return None
        bucket.level -= records
        return max(0.0, -bucket.level / self.rate)


class ActiveJobs:
    """The jobs heard from within `window_seconds`, at most `max_jobs` of them: a batch of a job
    already reporting always goes through, a new job past the limit is refused until another job
    has been quiet for the window. Counted per server replica (each sees the agents it serves)."""

    def __init__(
        self, max_jobs: int, window_seconds: float = 3600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_jobs = max_jobs
        self.window = window_seconds
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # job -> last heard, oldest first

    def admit(self, job_id: str) -> bool:
        if self.max_jobs <= 0:
            return True
        now = self.clock()
        if self._seen.pop(job_id, None) is not None:
            self._seen[job_id] = now
            return True
        while self._seen and next(iter(self._seen.values())) < now - self.window:
            self._seen.popitem(last=False)
        if len(self._seen) >= self.max_jobs:
            return False
        self._seen[job_id] = now
        return True
