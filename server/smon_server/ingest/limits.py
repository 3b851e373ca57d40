"""Per-agent rate limits, so one broken job (an agent in a tight loop, a misconfigured batch size)
cannot take the ingest capacity every other job shares.

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
