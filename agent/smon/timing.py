"""Clocks that mark phase boundaries on the training thread and turn marks into seconds later.

Marking must cost next to nothing (it runs inside hooks on the hot path); turning two marks into a
duration may wait (CUDA events complete asynchronously) and runs on the shipper thread. The host
clock's mark is a bare `time.perf_counter()` float; `cuda_timing.CudaClock` marks with CUDA events.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

Mark = Any  # a float for HostClock, a CudaMark for CudaClock


class Clock(Protocol):
    """What the step tracker needs from a timing backend."""

    #: True when marks are device events whose durations reflect device execution.
    device: bool

    def mark(self) -> Mark:
        """A point in time, taken now (cheap; never blocks)."""
        ...

    def ready(self, mark: Mark) -> bool:
        """Whether `mark` can be read without blocking."""
        ...

    def elapsed(self, start: Mark, end: Mark) -> float:
        """Seconds from `start` to `end`; both must be ready."""
        ...

    def host_time(self, mark: Mark) -> float:
        """The `time.perf_counter()` value when the mark was taken (always available)."""
        ...


class HostClock:
    """Wall-clock timing for CPU training: marks are `perf_counter()` floats."""

    device = False

    def __init__(self) -> None:
        # Bound directly to the builtin: one C call per mark, no Python frame.
        self.mark = time.perf_counter

    @staticmethod
    def ready(mark: Mark) -> bool:
        return True

    @staticmethod
    def elapsed(start: Mark, end: Mark) -> float:
        return float(end - start)

    @staticmethod
    def host_time(mark: Mark) -> float:
        return float(mark)
