"""The step in progress: its number, open phases and finished spans, cut into a RawStep at step end.

Everything here runs on the training thread (or autograd engine threads), so it only stores marks
and small tuples. A step's end is one `deque.append` of a tuple of what the step holds; the feeder
thread turns those tuples into `RawStep`s (`collect`: wall-clock anchor, GC pauses, drops), and
then into wire `StepRecord`s (`records.py`). No lock on the training thread: the training thread
is the only writer of the step state; autograd threads only append spans, and the feeder only
reads numbers and pops whole tuples.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from smon.cuda_timing import CudaClock
from smon.seqstats import SeqSample, lengths_from_forward_kwargs
from smon.timing import Clock, Mark
from smon.v1 import ingest_pb2 as pb

# (kind, start mark, end mark, micro-batch or None, model chunk)
RawSpan = tuple[str, Mark, Mark, int | None, int]

_MAX_OPEN_PHASES = 32  # phases opened but never closed (a forward that raised) must not pile up
# A step that never ends (no optimizer, no mon.step()) must not grow memory without bound; the
# server refuses steps with more than 4096 spans anyway.
MAX_SPANS_PER_STEP = 4000
MAX_SEQ_SAMPLES_PER_STEP = 4000


_MAX_PENDING_PAUSES = 4096  # GC pauses not yet placed in a step (a loop that stopped ending steps)
_ANCHOR_SLACK = 1e-3  # re-anchor wall time only when the system clock moved by more than this

# What the training thread hands over at each step end: (sequence number, step, start mark, end
# mark, spans, sequence samples, whether the end mark is also the next recorded step's start)
EndedStep = tuple[int, int, Mark, Mark, list[RawSpan], Sequence[SeqSample], bool]
_NO_SEQ: tuple[SeqSample, ...] = ()  # an ended step's samples when it has none
ErrorReport = Callable[[str, BaseException], None]  # ErrorCounter.report: count, log once, never raise
# (torch.autograd.backward, args, kwargs) -> the call run once and returned (backward_calls.py)
BackwardTimer = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


@dataclass(slots=True)
class RawStep:
    """A finished step as the hooks saw it: marks not yet turned into seconds."""

    step: int
    clock: Clock
    wall_anchor: float  # time.time() - perf_counter(): host mark -> Unix time
    start: Mark
    end: Mark
    spans: list[RawSpan]
    gc_pauses: list[tuple[float, float]]  # (perf_counter at GC start, seconds)
    seq: Sequence[SeqSample] = field(default_factory=list)
    ended_at: float = 0.0  # perf_counter at step end (for the CUDA read-back timeout)
    end_is_next_start: bool = False  # the next recorded step starts at this step's end mark
    read_on_device: bool = False  # set once its marks have been read as device events


class ForwardOwner(Protocol):
    """Who is told about training forwards (`StepTracker.timed_forward`): `ModelHooks`."""

    module: Any  # the attached instance
    forwards_until_after: int  # counted down per training forward; `after_forward` runs at <= 0

    def after_forward(self, microbatch: int, output: Any) -> None: ...


def _nothing() -> None:
    pass


def _raise(kind: str, exc: BaseException) -> None:
    raise exc


def wall_anchor() -> float | None:
    """`time.time() - perf_counter()`, or None if this thread was preempted between the readings."""
    before = time.perf_counter()
    wall = time.time()
    after = time.perf_counter()
    if after - before > 1e-4:
        return None
    return wall - (before + after) / 2


class StepTracker:
    """Collects the spans of the step in progress; `collect` hands finished steps to the feeder."""

    def __init__(
        self,
        clock: Clock,
        *,
        start_step: int = 0,
        capacity: int = 10_000,
        gc_drain: Callable[[], list[tuple[float, float]]] | None = None,
        on_overflow: Callable[[int], None] | None = None,
        on_backlog: Callable[[], None] | None = None,
        backlog: int = 0,
    ) -> None:
        self.clock = clock
        self._mark = clock.mark
        self.active = True
        # A device clock times the steps its sampling picks (sampling.py) and the others are not
        # recorded; `timed` says whether the step in progress is one of them (always, on the host).
        self._device_clock: CudaClock | None = clock if isinstance(clock, CudaClock) else None
        self.timed = True
        self.skipped = 0  # steps not recorded because the device clock did not time them
        self._last_end_host = 0.0  # host time of the last step end (the sampling's step time)
        if self._device_clock is not None:
            self.timed = self._device_clock.sampling.timed(start_step)
            if self.timed:
                self._device_clock.begin_timed()
        self._gc_drain = gc_drain
        self._on_overflow = on_overflow  # told once per step that hits a cap
        self.step = start_step  # number of the step in progress
        self.last_step = start_step - 1
        self._attach_mark: Mark = clock.mark()
        self._start: Mark | None = None  # set by the first activity of step `start_step`
        self._spans: list[RawSpan] = []
        self._seq: list[SeqSample] = []
        # Open phases, innermost last; the oldest drop out past the cap (a forward that raised
        # never closes its phase).
        self._open: deque[tuple[str, Mark]] = deque(maxlen=_MAX_OPEN_PHASES)
        self._forwards: dict[int, int] = {}  # model chunk -> forwards started this step
        self._backwards: dict[int, int] = {}  # model chunk -> backward calls paired this step
        self._forward_open: int | None = None  # micro-batch of the forward in progress, if any
        self._step_phase: tuple[str, Mark] | None = None  # open phase that ends with the step
        self._report: ErrorReport = _raise  # counts the post hook's errors (optimizer_step_hooks)
        self._overflowed = False  # this step hit MAX_SPANS_PER_STEP
        # Ended steps wait here for the feeder; when it falls behind, the oldest are dropped.
        self.ended: deque[EndedStep] = deque(maxlen=max(1, capacity))
        self._ended_count = 0
        self._on_backlog = on_backlog or _nothing  # called once when `backlog` steps are waiting
        self._backlog = backlog if on_backlog is not None else -1
        # Feeder side (the lock is never taken on the training thread)
        self._collect_lock = threading.Lock()
        self.dropped = 0  # ended steps the feeder never saw (the deque was full)
        self._collected = 0  # sequence number of the last step collected
        self._anchor = wall_anchor() or time.time() - time.perf_counter()
        self._pauses: list[tuple[float, float]] = []  # GC pauses after the last collected step

    # -- phases -----------------------------------------------------------------------------
    # open / close run on the training thread several times per step, so they take no lock: a
    # list or deque append or pop is atomic under the GIL, and end_step swaps whole lists. A span closed
    # on another thread during end_step's swap lands in the step just cut, which is where it
    # ended anyway.
    def open(self, kind: str, mark: Mark | None = None) -> Mark:
        """Mark the start of a phase (now, or at `mark`); it shows in heartbeats until closed."""
        if mark is None:
            mark = self._mark()
        if self._start is None:
            self._start = mark
        self._open.append((kind, mark))
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

    def close_and_open(
        self, kind: str, start: Mark, microbatch: int | None, chunk: int, next_kind: str
    ) -> Mark:
        """Close `kind` (opened at `start`) and open `next_kind` at the same mark, in one call:
        DDP's backward-end callback does this every step (backward ends, grad_sync begins)."""
        spans = self._spans
        opened = self._open
        if len(spans) >= MAX_SPANS_PER_STEP:
            end = self.close(kind, start, microbatch, chunk)  # past the cap: said once there
        else:
            end = self._mark()
            spans.append((kind, start, end, microbatch, chunk))
            if opened and opened[-1][1] is start:
                opened.pop()
            else:
                self.discard(start)
        if self._start is None:
            self._start = end
        opened.append((next_kind, end))
        return end

    def discard(self, start: Mark) -> None:
        """Forget an open phase without recording a span."""
        opened = self._open
        for i in range(len(opened) - 1, -1, -1):
            if opened[i][1] is start:
                del opened[i]
                break

    def discard_quietly(self, start: Mark, report: ErrorReport, kind: str) -> None:
        """`discard`, for a timed call that raised: an error of SMon's is counted as `kind`, never
        raised in place of the caller's own exception."""
        try:
            self.discard(start)
            self.unmark(start)
        except Exception as exc:
            report(kind, exc)

    def unmark(self, mark: Mark) -> None:
        """A mark no span will hold (the call it began raised, the loader's epoch ended): a device
        clock takes its event back at once (re-recording a pending event is allowed)."""
        device = self._device_clock
        if device is not None:
            device.release((mark,))

    # -- micro-batches ----------------------------------------------------------------------
    # A training forward is one phase and one micro-batch: the tracker keeps both, and the hooks
    # make one call to it each way. These run on every forward and backward, so they do `open` /
    # `close`'s work themselves rather than call them (each Python call is training-thread time).
    def open_forward(self, chunk: int) -> tuple[int, Mark]:
        """A training forward of model chunk `chunk` starts now: (its micro-batch index among this
        step's forwards of that chunk, its start mark)."""
        forwards = self._forwards
        index = forwards.get(chunk, 0)
        forwards[chunk] = index + 1
        self._forward_open = index
        mark = self._mark()
        if self._start is None:
            self._start = mark
        self._open.append(("forward", mark))
        return index, mark

    def close_forward(self, kind: str, start: Mark, microbatch: int | None, chunk: int) -> Mark:
        """The forward opened at `start` returned (`kind` is "forward" or "eval")."""
        self._forward_open = None
        end = self._mark()
        spans = self._spans
        if len(spans) >= MAX_SPANS_PER_STEP:
            return self.close(kind, start, microbatch, chunk, end)  # past the cap: said once there
        spans.append((kind, start, end, microbatch, chunk))
        opened = self._open
        if opened and opened[-1][1] is start:
            opened.pop()
        else:
            self.discard(start)
        return end

    def abandon_forward(self, start: Mark) -> None:
        """The forward opened at `start` raised: no span."""
        self._forward_open = None
        self.discard(start)
        self.unmark(start)

    def next_backward(self, chunk: int) -> int | None:
        """A backward of model chunk `chunk` starts: the micro-batch it is the backward of (this
        step's forwards and backwards pair in order), or None when no forward is waiting for one."""
        backwards = self._backwards
        index = backwards.get(chunk, 0)
        if index >= self._forwards.get(chunk, 0):
            return None
        backwards[chunk] = index + 1
        return index

    # -- the data loader's next() and the optimizer's step hooks -----------------------------
    # These run on every step, so they are made here as closures over the tracker that do open /
    # close's work inline: a Python call fewer per phase boundary on the training thread.
    def timed_next(self, next_fn: Callable[[Any], Any], report: ErrorReport) -> Callable[[Any], Any]:
        """`next_fn` (an iterator -> its next item) with the time blocked in it as a `data_wait`
        span. End of epoch (StopIteration) or a loader error: no batch was waited for, no span."""
        tracker = self
        mark = self._mark

        def __next__(iterator: Any) -> Any:
            if not tracker.active:
                return next_fn(iterator)
            try:
                start = mark()
                if tracker._start is None:
                    tracker._start = start
                opened = tracker._open
                opened.append(("data_wait", start))
            except Exception as exc:
                report("data_wait", exc)
                return next_fn(iterator)
            try:
                item = next_fn(iterator)
            except BaseException:
                tracker.discard_quietly(start, report, "data_wait")
                raise
            try:
                spans = tracker._spans
                if len(spans) >= MAX_SPANS_PER_STEP:
                    tracker.close("data_wait", start)  # past the cap: said once there
                else:
                    spans.append(("data_wait", start, mark(), None, 0))
                    if opened and opened[-1][1] is start:
                        opened.pop()
                    else:
                        tracker.discard(start)
            except Exception as exc:
                report("data_wait", exc)
            return item

        return __next__

    def timed_forward(
        self,
        chunk: int,
        owner: ForwardOwner,
        forward: Callable[..., Any],
        is_grad_enabled: Callable[[], bool],
        report: ErrorReport,
    ) -> Callable[..., Any]:
        """`forward` (a module class's own) timed for model chunk `chunk`, as the `forward` of the
        attached instance's timed class (timed_forward.py): the time in it a `forward` span (an
        `eval` one in eval mode or with grad off), its micro-batch counted.

        What `open_forward` / `close_forward` do, inline: with `ModelHooks.begin` / `end` that was
        four Python calls around every forward. After a training forward, once
        `owner.forwards_until_after` has counted down, `owner.after_forward(microbatch, output)`
        runs (every forward while the owner hooks outputs for backward; rarely otherwise)."""
        tracker = self
        mark = self._mark

        def timed(module: Any, *args: Any, **kwargs: Any) -> Any:
            if module is not owner.module or not tracker.active:  # (another instance of the class)
                return forward(module, *args, **kwargs)
            try:
                start = mark()
                if module.training and is_grad_enabled():
                    kind = "forward"
                    forwards = tracker._forwards
                    microbatch: int | None = forwards.get(chunk, 0)
                    forwards[chunk] = microbatch + 1  # type: ignore[operator]
                    tracker._forward_open = microbatch
                else:
                    kind, microbatch = "eval", None
                if tracker._start is None:
                    tracker._start = start
                opened = tracker._open
                opened.append((kind, start))
                if kwargs and microbatch is not None and tracker.timed:
                    lengths = lengths_from_forward_kwargs(kwargs, tracker.device_event)
                    if lengths is not None:
                        tracker.add_seq(lengths, microbatch, explicit=False)
            except Exception as exc:
                report("forward_pre_hook", exc)
                return forward(module, *args, **kwargs)
            try:
                output = forward(module, *args, **kwargs)
            except BaseException:
                tracker._forward_open = None
                tracker.discard_quietly(start, report, "forward_hook")
                raise
            try:
                tracker._forward_open = None
                if not tracker.active:  # closed during the forward
                    tracker.discard(start)
                    return output
                spans = tracker._spans
                if len(spans) >= MAX_SPANS_PER_STEP:
                    tracker.close(kind, start, microbatch, chunk)  # past the cap: said once there
                else:
                    spans.append((kind, start, mark(), microbatch, chunk))
                    if opened and opened[-1][1] is start:
                        opened.pop()
                    else:
                        tracker.discard(start)
                if microbatch is not None:
                    owner.forwards_until_after -= 1
                    if owner.forwards_until_after <= 0:
                        owner.after_forward(microbatch, output)
            except Exception as exc:
                report("forward_hook", exc)
            return output

        return timed

    def timed_backward(self, chunk: int, report: ErrorReport) -> BackwardTimer:
        """A `torch.autograd.backward` call timer for model chunk `chunk` (backward_calls.py calls
        it while the call times that model's backward): `backward(*args, **kwargs)` run once and
        returned, the time in it a `backward` span of the next forward waiting for one (`next_backward`'s
        pairing), or no span when none waits or the monitor is closed."""
        tracker = self
        mark = self._mark

        def timed(backward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not tracker.active:
                return backward(*args, **kwargs)
            try:
                backwards = tracker._backwards
                microbatch = backwards.get(chunk, 0)
                waits = microbatch < tracker._forwards.get(chunk, 0)
                if waits:
                    backwards[chunk] = microbatch + 1
                    start = mark()
                    if tracker._start is None:
                        tracker._start = start
                    opened = tracker._open
                    opened.append(("backward", start))
            except Exception as exc:
                report("backward_call", exc)
                waits = False
            if not waits:  # no forward waits for a backward (or the tracker failed): no span
                return backward(*args, **kwargs)
            try:
                result = backward(*args, **kwargs)
            except BaseException:
                tracker.discard_quietly(start, report, "backward_call")
                raise
            try:
                spans = tracker._spans
                if len(spans) >= MAX_SPANS_PER_STEP:
                    tracker.close("backward", start, microbatch, chunk)  # past the cap: said once there
                else:
                    spans.append(("backward", start, mark(), microbatch, chunk))
                    if opened and opened[-1][1] is start:
                        opened.pop()
                    else:
                        tracker.discard(start)
            except Exception as exc:
                report("backward_call", exc)
            return result

        return timed

    def optimizer_step_hooks(self, report: ErrorReport) -> tuple[Callable[..., None], Callable[..., None]]:
        """(pre, post) step hooks for the optimizer: `optimizer` span, and the step ends when
        `optimizer.step()` returns. The post hook is `end_step` itself (one Python call a step),
        which closes the phase the pre hook opened; from now on it counts its errors with
        `report` when torch calls it, never raising into `optimizer.step()`."""
        tracker = self
        mark = self._mark
        self._report = report

        def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
            if not tracker.active:
                return None
            try:
                start = mark()
                if tracker._start is None:
                    tracker._start = start
                phase = ("optimizer", start)
                tracker._open.append(phase)
                tracker._step_phase = phase
            except Exception as exc:
                report("optimizer_pre_hook", exc)
            return None

        return pre, self.end_step

    def paired_backwards(self, chunk: int) -> int:
        """Backward calls of model chunk `chunk` paired with a forward this step."""
        return self._backwards.get(chunk, 0)

    def current_microbatch(self) -> int:
        """The forward in progress, else the next one (what `record_batch` before a forward means)."""
        if self._forward_open is not None:
            return self._forward_open
        return self._forwards.get(0, 0)

    def add_seq(self, lengths: Any, microbatch: int | None, *, explicit: bool) -> None:
        if self._start is None:
            self._start = self._mark()
        mb = self.current_microbatch() if microbatch is None else microbatch
        if len(self._seq) < MAX_SEQ_SAMPLES_PER_STEP:
            self._seq.append(SeqSample(mb, lengths, explicit))

    # -- step boundaries --------------------------------------------------------------------
    def set_step(self, step: int) -> None:
        """Renumber the step in progress (e.g. after restoring a checkpoint)."""
        self.step = step

    def end_step(self, *hook_args: Any, end: Mark | None = None, number: int | None = None) -> None:
        """Close the step in progress at `end` (default now); the next step starts at the same mark.

        A phase that ends with the step (`_step_phase`: the optimizer's, opened by its pre hook)
        is closed here rather than by a `close` call of its own. This is also the optimizer's
        step post hook (`optimizer_step_hooks`), so a step's end is one Python call: torch passes
        `hook_args` (the optimizer, args, kwargs; unused), and then an error is counted, never
        raised, and a closed monitor ends no step."""
        if hook_args:
            if len(hook_args) != 3:  # SMon's own callers pass keywords only
                raise TypeError(f"end_step() takes keyword arguments, got {len(hook_args)} positional")
            if not self.active:
                return
        try:
            device = self._device_clock
            if device is not None:  # is the next step device-timed? Its start is this end.
                step = self.step if number is None else number
                timed_next = device.sampling.timed(step + 1)
                if timed_next and not device.on:
                    device.begin_timed()
            if end is None:
                end = self._mark()
            if device is not None:
                if not timed_next:
                    device.on = False
                host_end = device.host_time(end)
                if self._last_end_host:
                    device.sampling.observe(host_end - self._last_end_host)
                self._last_end_host = host_end
                if not self.timed:  # nothing of this step is recorded
                    self._skip_step(number, end)
                    self.timed = timed_next
                    return
                self.timed = timed_next
            else:
                timed_next = True
            spans = self._spans
            closing = self._step_phase
            if closing is not None:
                self._step_phase = None
                kind, opened_at = closing
                if len(spans) >= MAX_SPANS_PER_STEP:
                    self.close(kind, opened_at, end=end)  # past the cap: said once there
                else:
                    spans.append((kind, opened_at, end, None, 0))
                    opened = self._open
                    if opened and opened[-1] is closing:
                        opened.pop()
                    else:
                        self.discard(opened_at)
            step = self.step if number is None else number
            start = self._start
            self._spans = []
            seq: Sequence[SeqSample] = self._seq
            if seq:
                self._seq = []
            else:
                seq = _NO_SEQ  # not the empty list itself: the next step appends to that one
            if self._forwards:
                self._forwards = {}
            if self._backwards:
                self._backwards = {}
            self._overflowed = False
            self.last_step = step
            self.step = step + 1
            self._start = end
            count = self._ended_count + 1
            self._ended_count = count
            ended = self.ended
            start = self._attach_mark if start is None else start
            ended.append((count, step, start, end, spans, seq, timed_next))
            if len(ended) == self._backlog:
                self._on_backlog()  # a full batch is waiting: wake the feeder
        except Exception as exc:
            if not hook_args:
                raise
            self._report("optimizer_post_hook", exc)

    def _skip_step(self, number: int | None, end: Mark) -> None:
        """End a step the device clock did not time at `end`: nothing of it is kept."""
        step = self.step if number is None else number
        closing = self._step_phase
        if closing is not None:
            self._step_phase = None
            opened = self._open
            if opened and opened[-1] is closing:
                opened.pop()
            else:
                self.discard(closing[1])
        self._spans = []
        if self._seq:
            self._seq = []
        if self._forwards:
            self._forwards = {}
        if self._backwards:
            self._backwards = {}
        self._overflowed = False
        self.last_step = step
        self.step = step + 1
        self._start = end
        self.skipped += 1

    @property
    def device_event(self) -> Callable[[], Any] | None:
        """Where device-side captures (sequence lengths) get their event: the clock's pool."""
        device = self._device_clock
        return device.lend_event if device is not None else None

    # -- feeder side ------------------------------------------------------------------------
    def collect(self) -> list[RawStep]:
        """The steps ended since the last call, as RawSteps with their GC pauses (feeder thread).

        A GC pause belongs to the first step that ended after the pause started, as when it was
        read at each step end. Sequence numbers that skip show steps dropped from a full deque.
        """
        ended = self.ended
        with self._collect_lock:
            items = [ended.popleft() for _ in range(len(ended))]
            if items:
                last = items[-1][0]
                self.dropped += last - self._collected - len(items)
                self._collected = last
        pauses = self._pauses
        if self._gc_drain is not None:
            pauses.extend(self._gc_drain())
        if not items:
            if len(pauses) > _MAX_PENDING_PAUSES:
                del pauses[: len(pauses) - _MAX_PENDING_PAUSES]
            return []
        anchor = wall_anchor()
        if anchor is not None and abs(anchor - self._anchor) > _ANCHOR_SLACK:
            self._anchor = anchor  # the system clock was set: Unix times follow it from here
        clock = self.clock
        host_time = clock.host_time
        raws: list[RawStep] = []
        sampled = self._device_clock is not None  # steps between recorded ones are missing
        for _, step, start, end, spans, seq, end_is_next_start in items:
            ended_at = host_time(end)
            mine: list[tuple[float, float]] = []
            if pauses:
                mine = [p for p in pauses if p[0] <= ended_at]
                if mine:
                    pauses = [p for p in pauses if p[0] > ended_at]
                    if sampled:  # a pause in a step that was not recorded is not this one's
                        began = host_time(start)
                        mine = [p for p in mine if p[0] >= began]
            raws.append(
                RawStep(step, clock, self._anchor, start, end, spans, mine, seq, ended_at, end_is_next_start)
            )
        self._pauses = pauses[-_MAX_PENDING_PAUSES:]
        return raws

    def uncollected_drops(self) -> int:
        """Steps pushed out of the full deque that `collect` has not counted yet."""
        with self._collect_lock:
            return max(0, self._ended_count - self._collected - len(self.ended))

    # -- heartbeat --------------------------------------------------------------------------
    def heartbeat(self) -> pb.Heartbeat:
        """Where this rank stands now: last completed step, step in progress, innermost open phase."""
        phase, since = "", 0.0
        try:
            phase, mark = self._open[-1]
        except IndexError:  # none open (the training thread may pop meanwhile)
            pass
        else:
            since = self._anchor + self.clock.host_time(mark)
        return pb.Heartbeat(
            time=time.time(),
            last_step=self.last_step,
            current_step=self.step,
            phase=phase,
            phase_since=since,
        )
