"""CUDA-event timing: phase boundaries are events recorded on the current stream, read back later.

On a GPU the CPU runs ahead of the device, so host timestamps measure kernel *launch*, not
execution. An event recorded at each boundary is stamped when the device reaches it; the shipper
thread reads pairs with `event.query()` / `elapsed_time()` once they have completed (typically a
step later). Nothing here ever calls `torch.cuda.synchronize()` or `event.synchronize()`.

The CUDA module is injected (`torch.cuda` in production, `smon.testing.FakeCuda` in tests) so this
path runs and is tested on machines without a GPU.
"""

from __future__ import annotations

import time
from typing import Any

from smon.timing import Mark


class CudaMark:
    """A recorded CUDA event plus the host time it was recorded at (the fallback when it never completes)."""

    __slots__ = ("event", "host")

    def __init__(self, event: Any, host: float) -> None:
        self.event = event
        self.host = host


class CudaClock:
    """Marks with timing-enabled CUDA events on the current stream of one device."""

    device = True

    def __init__(self, cuda: Any, device: Any = None) -> None:
        self._cuda = cuda
        self._device = device

    @classmethod
    def for_device(cls, device: Any) -> CudaClock:
        import torch

        return cls(torch.cuda, device)

    def mark(self) -> Mark:
        event = self._cuda.Event(enable_timing=True)
        # The current stream *of our device*: hooks may run on autograd or collective-callback
        # threads whose current device differs, and whose current stream is the one that matters
        # (DDP future callbacks run on a stream synchronized with the collective).
        event.record(self._cuda.current_stream(self._device))
        return CudaMark(event, time.perf_counter())

    @staticmethod
    def ready(mark: Mark) -> bool:
        if isinstance(mark, CudaMark):
            return bool(mark.event.query())
        return True

    @staticmethod
    def elapsed(start: Mark, end: Mark) -> float:
        if isinstance(start, CudaMark) and isinstance(end, CudaMark):
            return float(start.event.elapsed_time(end.event)) / 1000.0
        return CudaClock.host_time(end) - CudaClock.host_time(start)

    @staticmethod
    def host_time(mark: Mark) -> float:
        return mark.host if isinstance(mark, CudaMark) else float(mark)


class HostFallbackClock:
    """Reads a CUDA step's marks by their host times: used when its events never complete."""

    device = False

    @staticmethod
    def mark() -> Mark:
        return time.perf_counter()

    @staticmethod
    def ready(mark: Mark) -> bool:
        return True

    @staticmethod
    def elapsed(start: Mark, end: Mark) -> float:
        return CudaClock.host_time(end) - CudaClock.host_time(start)

    @staticmethod
    def host_time(mark: Mark) -> float:
        return CudaClock.host_time(mark)
