"""CUDA-event timing: phase boundaries are events recorded on the device's stream, read back later.

On a GPU the CPU runs ahead of the device, so host timestamps measure kernel *launch*, not
execution. An event recorded at each boundary is stamped when the device reaches it; the feeder
thread reads a step once its last event has completed (typically a step later). Nothing here ever
calls `torch.cuda.synchronize()` or `event.synchronize()`.

What an event costs is kept small (docs/agent.md, "CUDA"):
- only the steps `DeviceSampling` picks are device-timed; on the others `mark()` is a host
  timestamp and the step is not recorded;
- events come from a pool and go back to it once read: none is constructed in steady state;
- every event of a timed step goes on one stream, looked up once when the step starts (the
  current stream of the model's device on the training thread), so the step's last event
  completing means all of them have: one `query()` per read.

The CUDA module is injected (`torch.cuda` in production, `smon.testing.FakeCuda` in tests) so this
path runs and is tested on machines without a GPU.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from smon.sampling import DeviceSampling
from smon.timing import Mark

POOL_SIZE = 64  # events made at attach: a timed step uses ~10, and a few steps are in flight
MAX_POOL = 4096  # events kept for reuse at most (a read-back far behind returns many at once)


class CudaMark:
    """A recorded CUDA event plus the host time it was recorded at (the fallback when it never completes)."""

    __slots__ = ("event", "host")

    def __init__(self, event: Any, host: float) -> None:
        self.event = event
        self.host = host


class CudaClock:
    """Marks with pooled timing events on the steps `sampling` picks, host timestamps on the rest.

    The step tracker switches it per step (`begin_timed` / `on = False`); marks are taken on the
    training thread and on autograd's device threads, events returned by the feeder thread
    (`release`): the pool is a deque, whose pop and append are atomic under the GIL."""

    device = True

    def __init__(self, cuda: Any, device: Any = None, *, sampling: DeviceSampling | None = None) -> None:
        self._cuda = cuda
        self._device = device
        # (made directly, as tests do, it times every step; attach passes the configured one)
        self.sampling = sampling if sampling is not None else DeviceSampling(1)
        self.created = 0  # events constructed (tests: none after warm-up)
        self._free: deque[Any] = deque()
        for _ in range(POOL_SIZE):
            self._free.append(self._new_event())
        self._stream: Any = None
        self.on = False  # marks are device events now
        self._host = time.perf_counter

    @classmethod
    def for_device(cls, device: Any, sampling: DeviceSampling | None = None) -> CudaClock:
        import torch

        return cls(torch.cuda, device, sampling=sampling)

    def _new_event(self) -> Any:
        self.created += 1
        return self._cuda.Event(enable_timing=True)

    def begin_timed(self) -> None:
        """A device-timed step (block) starts: marks are events on the device's current stream."""
        self._stream = self._cuda.current_stream(self._device)
        self.on = True

    def mark(self) -> Mark:
        if not self.on:
            return self._host()
        try:
            event = self._free.pop()
        except IndexError:
            event = self._new_event()
        event.record(self._stream)
        return CudaMark(event, self._host())

    def lend_event(self) -> Any:
        """A pooled event for something else ordered on the device (sequence-length copies);
        it goes back with the step's marks (`release`)."""
        try:
            return self._free.pop()
        except IndexError:
            return self._new_event()

    def release(self, marks: Iterable[Any]) -> None:
        """Events of a step that has been read: back to the pool (each mark released once)."""
        free = self._free
        for mark in marks:
            if isinstance(mark, CudaMark):
                mark = mark.event
            elif isinstance(mark, float):
                continue
            if len(free) < MAX_POOL:
                free.append(mark)

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
