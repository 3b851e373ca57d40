"""Error accounting for code SMon runs inside training: every error is counted, each kind logged once.

The agent's first rule is that training never sees an exception from SMon and is never slowed by
it. Hooks therefore catch everything; a broken hook must not flood the training log either, so a
kind of error is logged the first time and only counted after that (the count travels to the
server in `AgentCounters.errors`).
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("smon")


class ErrorCounter:
    """Counts SMon-internal errors and logs the first of each kind at WARNING."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._seen: set[str] = set()

    @property
    def count(self) -> int:
        return self._count

    def report(self, kind: str, exc: BaseException) -> None:
        """Record one error of `kind`; never raises."""
        try:
            with self._lock:
                self._count += 1
                first = kind not in self._seen
                self._seen.add(kind)
            if first:
                logger.warning(
                    "smon: %s failed: %r (training continues; further %s errors are only counted)",
                    kind,
                    exc,
                    kind,
                    exc_info=exc,
                )
        except Exception:  # logging itself failed: nothing more we can safely do
            pass


class OnceLog:
    """Logs a message the first time its key is seen ("say so once and carry on")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def __call__(self, key: str, level: int, msg: str, *args: object) -> bool:
        """Log `msg` if `key` is new; returns whether it was logged."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        logger.log(level, msg, *args)
        return True

    def seen(self, key: str) -> bool:
        return key in self._seen
