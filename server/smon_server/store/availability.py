"""Whether this process reaches its database, as its own statements find it: one log line when an
outage begins, one when it ends.

Every part of the server meets an outage on its own (each ingest group, API request, analysis
pass and scrape), and each used to log it with a traceback: a 19-second outage wrote 211 ERROR
lines and 438 tracebacks. Here they report to one place instead. The first failure logs why the
database is away; the first success after it logs how long that lasted and what was turned away
meanwhile, as counts ("212 ingest batches refused, 3 API requests answered 503"). Tracebacks are
for failures that are not the database being away (store/db.py DATABASE_UNAVAILABLE): bugs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger(__name__)


def reason(exc: BaseException) -> str:
    """The driver's own words, on one line, without SQLAlchemy's wrapping and links."""
    cause = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    text = "; ".join(line for line in lines if not line.startswith("(Background on this error"))
    return (text or type(cause).__name__)[:300]


class Availability:
    """Outage bookkeeping shared by every thread of one server process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._turned_away: Counter[str] = Counter()
        self.outages = 0  # outages begun in this process (tests read it)

    def failed(self, exc: BaseException, turned_away: str | None = None) -> None:
        """A statement failed because the database is away; `turned_away` names what this cost
        ("ingest batches refused"), counted for the line that ends the outage."""
        state = str(getattr(getattr(exc, "orig", None) or exc, "sqlstate", None) or "")
        if state.startswith("40"):  # a deadlock or serialization failure: the database answered
            log.warning("a transaction was rolled back (%s); what it held is tried again", reason(exc))
            return
        with self._lock:
            if turned_away:
                self._turned_away[turned_away] += 1
            if self._down_since is not None:
                return
            self._down_since = self._clock()
            self.outages += 1
        log.warning(
            "database unavailable: %s. Until it is back: ingest answers UNAVAILABLE (agents keep "
            "their batches and resend them), the API 503, analysis waits; one line when it is back",
            reason(exc),
        )

    def succeeded(self) -> None:
        """A statement was answered: if the database was away, it is back."""
        if self._down_since is None:  # the common case: no lock
            return
        with self._lock:
            if self._down_since is None:
                return
            seconds = self._clock() - self._down_since
            counts, self._turned_away = self._turned_away, Counter()
            self._down_since = None
        meanwhile = ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "nothing turned away"
        log.warning("database available again after %.1f s; meanwhile: %s", seconds, meanwhile)
