"""The step in progress: its number, open phases and finished spans, cut into a RawStep at step end.

Everything here runs on the training thread (or autograd engine threads), so it only stores marks
and small tuples; turning them into a `StepRecord` happens on the feeder thread (`records.py`).
Phases open and close without a lock (see `open`); a reentrant lock guards the step swap and the
heartbeat, which the feeder thread reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smon.seqstats import SeqSample
from smon.timing import Clock, Mark
from smon.v1 import ingest_pb2 as pb

# (kind, start mark, end mark, micro-batch or None, model chunk)
RawSpan = tuple[str, Mark, Mark, int | None, int]

_MAX_OPEN_PHASES = 32  # phases opened but never closed (a forward that raised) must not pile up
# A step that never ends (no optimizer, no mon.step()) must not grow memory without bound; the
# server refuses steps with more than 4096 spans anyway.
MAX_SPANS_PER_STEP = 4000
MAX_SEQ_SAMPLES_PER_STEP = 4000


@dataclass(slots=True)
class RawStep:
    """A finished step as the hooks saw it: marks not yet turned into seconds."""

    step: int
    clock: Clock
    wall_anchor: float  # time.time() - perf_counter() when the step started: host mark -> Unix time
    start: Mark
    end: Mark
    spans: list[RawSpan]
    gc_pauses: list[tuple[float, float]]  # (perf_counter at GC start, seconds)
    seq: list[SeqSample] = field(default_factory=list)
    ended_at: float = 0.0  # perf_counter at step end (for the CUDA read-back timeout)


class StepTracker:
    """Collects the spans of the step in progress and emits a RawStep when the step ends."""

    def __init__(
        self,
        clock: Clock,
        sink: Callable[[RawStep], None],
        *,
        start_step: int = 0,
        gc_drain: Callable[[], list[tuple[float, float]]] | None = None,
        on_overflow: Callable[[int], None] | None = None,
    ) -> None:
        self.clock = clock
        self._mark = clock.mark
        self.active = True
        self._sink = sink
        self._gc_drain = gc_drain
        self._on_overflow = on_overflow  # told once per step that hits a cap
        self._lock = threading.RLock()
        self.step = start_step  # number of the step in progress
        self.last_step = start_step - 1
        self._attach_mark: Mark = clock.mark()
        self._start: Mark | None = None  # set by the first activity of step `start_step`
        self._anchor = time.time() - time.perf_counter()
        self._spans: list[RawSpan] = []
        self._seq: list[SeqSample] = []
        self._open: list[tuple[str, Mark]] = []
        self._forwards: dict[int, int] = {}  # model chunk -> forwards started this step
        self._forward_open: int | None = None  # micro-batch of the forward in progress, if any
        self._overflowed = False  # this step hit MAX_SPANS_PER_STEP

    # -- phases -----------------------------------------------------------------------------
    # open / close run on the training thread several times per step, so they take no lock: a
    # list append or pop is atomic under the GIL, and the only other writers (end_step, add_seq,
    # set_step) swap whole lists under `_lock`. A span closed on another thread during end_step's
    # swap lands in the step just cut, which is where it ended anyway.
    def open(self, kind: str, mark: Mark | None = None) -> Mark:
        """Mark the start of a phase (now, or at `mark`); it shows in heartbeats until closed."""
        if mark is None:
            mark = self._mark()
        if self._start is None:
            self._start = mark
        opened = self._open
        opened.append((kind, mark))
        if len(opened) > _MAX_OPEN_PHASES:
            del opened[0]
        return mark

    def close(
        self, kind: str, start: Mark, microbatch: int | None = None, chunk: int = 0, end: Mark | None = None
    ) -> Mark:
        """Record the span [start, end or now] in the step in progress."""
        if end is None:
            end = self._mark()
        spans = self._spans
        if len(spans) < MAX_SPANS_PER_STEP:
            spans.append((kind, start, end, microbatch, chunk))
        elif not self._overflowed:
            self._overflowed = True
            if self._on_overflow is not None:
                self._on_overflow(self.step)
        opened = self._open
        if opened and opened[-1][1] is start:
            opened.pop()  # the common case: the innermost phase closes
        else:
            self.discard(start)
        return end

    def discard(self, start: Mark) -> None:
        """Forget an open phase without recording a span."""
        opened = self._open
        for i in range(len(opened) - 1, -1, -1):
            if opened[i][1] is start:
                del opened[i]
                break

    # -- micro-batches ----------------------------------------------------------------------
    def begin_forward(self, chunk: int) -> int:
        """Index of the forward starting now among this step's forwards of `chunk`."""
        forwards = self._forwards
        index = forwards.get(chunk, 0)
        forwards[chunk] = index + 1
        self._forward_open = index
        return index

    def end_forward(self) -> None:
        self._forward_open = None

    def current_microbatch(self) -> int:
        """The forward in progress, else the next one (what `record_batch` before a forward means)."""
        if self._forward_open is not None:
            return self._forward_open
        return self._forwards.get(0, 0)

    def add_seq(self, lengths: Any, microbatch: int | None, *, explicit: bool) -> None:
        with self._lock:
            if self._start is None:
                self._start = self.clock.mark()
            mb = self.current_microbatch() if microbatch is None else microbatch
            if len(self._seq) < MAX_SEQ_SAMPLES_PER_STEP:
                self._seq.append(SeqSample(mb, lengths, explicit))

    # -- step boundaries --------------------------------------------------------------------
    def set_step(self, step: int) -> None:
        """Renumber the step in progress (e.g. after restoring a checkpoint)."""
        with self._lock:
            self.step = step

    def end_step(self, end: Mark | None = None, number: int | None = None) -> None:
        """Close the step in progress at `end` (default now); the next step starts at the same mark."""
        if end is None:
            end = self.clock.mark()
        with self._lock:
            step = self.step if number is None else number
            raw = RawStep(
                step=step,
                clock=self.clock,
                wall_anchor=self._anchor,
                start=self._attach_mark if self._start is None else self._start,
                end=end,
                spans=self._spans,
                gc_pauses=self._gc_drain() if self._gc_drain is not None else [],
                seq=self._seq,
                ended_at=time.perf_counter(),
            )
            self._spans = []
            self._seq = []
            self._forwards = {}
            self._overflowed = False
            self.last_step = step
            self.step = step + 1
            self._start = end
            self._anchor = time.time() - time.perf_counter()
        self._sink(raw)

    # -- heartbeat --------------------------------------------------------------------------
    def heartbeat(self) -> pb.Heartbeat:
        """Where this rank stands now: last completed step, step in progress, innermost open phase."""
        with self._lock:
            phase, since = "", 0.0
            opened = self._open[-1:]  # a slice: the training thread may pop meanwhile
            if opened:
                phase, mark = opened[0]
                since = self._anchor + self.clock.host_time(mark)
            return pb.Heartbeat(
                time=time.time(),
                last_step=self.last_step,
                current_step=self.step,
                phase=phase,
                phase_since=since,
            )
