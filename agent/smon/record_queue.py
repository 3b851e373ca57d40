"""The bounded hand-off between the training thread and the shipper: never blocks, drops the oldest.

When the server is slow or away, memory stays bounded and the *newest* records survive (they
describe the job as it is now); every drop is counted and reported in later batches.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class RecordQueue:
    def __init__(self, capacity: int, *, threshold: int = 0, on_threshold: Callable[[], None] | None = None):
        self.capacity = max(1, capacity)
        self.dropped = 0
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self._threshold = threshold
        self._on_threshold = on_threshold

    def put(self, item: Any) -> None:
        """Append `item`; if full, drop the oldest record first. O(1), never blocks on I/O."""
        with self._lock:
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            size = len(self._items)
        if self._on_threshold is not None and self._threshold and size % self._threshold == 0:
            self._on_threshold()  # a full batch is waiting: wake the shipper early

    def count_dropped(self, n: int) -> None:
        """Count records dropped before they reached this queue."""
        with self._lock:
            self.dropped += n

    def drain(self, max_items: int) -> list[Any]:
        """Take up to `max_items` of the oldest records."""
        with self._lock:
            n = min(max_items, len(self._items))
            return [self._items.popleft() for _ in range(n)]

    def discard_all(self) -> int:
        """Drop everything (process exit without delivery); the drops are counted."""
        with self._lock:
            n = len(self._items)
            self._items.clear()
            self.dropped += n
            return n

    def __len__(self) -> int:
        return len(self._items)
