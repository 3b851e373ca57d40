"""Python garbage-collection pauses, timed with `gc.callbacks`.

A full collection stops every Python thread (it holds the GIL), so a pause on any thread delays
the training loop; pauses that differ between ranks make one rank the straggler of the step. The
callback runs inside the collector, so it only takes a timestamp and appends to a bounded deque;
the step tracker drains the deque at each step end.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from typing import Any

from smon.errors import ErrorCounter

_MAX_PENDING = 4096  # pauses kept between two step ends (a stuck loop must not grow memory)


class GcWatch:
    def __init__(self, errors: ErrorCounter) -> None:
        self._errors = errors
        self._pauses: deque[tuple[float, float]] = deque(maxlen=_MAX_PENDING)
        self._started_at = 0.0
        self._installed = False
        self.active = True

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def remove(self) -> None:
        if self._installed:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._callback)
            self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Collections never overlap (they hold the GIL), so one start slot suffices.
        try:
            if not self.active:
                return
            if phase == "start":
                self._started_at = time.perf_counter()
            elif phase == "stop" and self._started_at:
                end = time.perf_counter()
                self._pauses.append((self._started_at, end - self._started_at))
                self._started_at = 0.0
        except Exception as exc:
            self._errors.report("gc_callback", exc)

    def drain(self) -> list[tuple[float, float]]:
        """(perf_counter at start, seconds) of the pauses since the last drain."""
        pauses = self._pauses
        if not pauses:
            return []
        self._pauses = deque(maxlen=_MAX_PENDING)
        return list(pauses)
