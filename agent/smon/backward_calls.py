"""Backward timed from the call to `torch.autograd.backward`, where a probe has shown it is exact.

The gradient hook on a forward's output (hooks.py) times backward from inside autograd: the engine
calls into Python at the start of that micro-batch's backward and again for the end callback, each
a GIL round trip with a wrapped tensor. On a small step that is most of SMon's training-thread
time (not its instructions: the GIL hand-overs cost the time). Most training loops start backward
with `loss.backward()` or `torch.autograd.backward(...)`, and `Tensor.backward` calls the latter,
so a wrapper around that function sees the same backward for two clock readings.

The wrapper is only exact where each call is the backward of one pending training forward and
little else, so a model starts on hooks and the wrapper watches (`Probe`). It takes over after
`PROBE_CALLS` calls in which, every time:
- the output hook of the next pending micro-batch fired inside the call, and nothing else did;
- no output hook fired outside a call (Megatron's pipeline schedules enter the engine directly);
- the hook fired soon after the call (the head: the loss's own backward; a discriminator or a
  perceptual-loss network outside the attached model would be far longer);
- the final callbacks queued by others after the hooks' own ran briefly (the tail: FSDP2's
  post-backward, or DDP's finalize around an attached inner module, would not).
"Soon" and "briefly" are `_FLOOR` or `_SHARE` of the backward, whichever is larger; one call in
a probe may be slower, a second fails the probe, so work that comes back every few micro-batches
(a sync on the last of 4) is seen. Wall time is also slow for reasons of no concern (a preempted
thread; the output hook waiting up to 5 ms for the GIL held by another Python thread, a delay the
call itself does not have), so a probe that failed only on time starts afresh, up to
`SLOW_PROBES_TOLERATED` times, before the hooks stay for good. Any other sight (a stray backward of
another graph, two micro-batches in one call, `autograd.grad` through the output, a second
backward of the same graph) keeps the hooks for good. After the switch, one forward in
`RECHECK_EVERY` is probed again (when no backward is pending), so a loop that changes later (a
periodic stray backward, a library restoring the original `torch.autograd.backward`) goes back
to hooks; a re-probe that is only slow starts a whole probe.

Never probed: DDP models (the exposed gradient-sync wait needs the engine callback between the end
of the graph and DDP's `finalize_backward`, ddp.py), and device clocks (CUDA: a foreign final
callback can be cheap on the host and still make the stream wait for communication, which the
host-time tail cannot see and the event-timed span would hold).

Timed by the wrapper, backward starts where `backward()` is called, so the head is in it; under
hooks it was in the untimed gap before it. Ranks that decided differently differ by less than the
bounds above.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smon.hooks import ModelHooks

PROBE_CALLS = 16  # calls that must match the hooks before the wrapper takes over
SLOW_CALLS_TOLERATED = 1  # calls past the bounds a probe forgives (a preempted thread)
SLOW_PROBES_TOLERATED = 3  # probes that failed only on time, each started afresh, before hooks for good
RECHECK_EVERY = 97  # forwards between re-probes once switched (odd, so periodic work rarely aliases)
# The head and the tail of a call (above) may each take this long (s), or this share of the
# backward, whichever is larger. The floor covers torch's own set-up in `backward()` before the
# first node runs (tens of µs, ~400 µs on a process's first call).
_FLOOR = 1e-3
_SHARE = 0.05


class Probe:
    """What the wrapper saw of one model's backwards while hooks still time them."""

    __slots__ = (
        "after_callbacks",
        "expected",
        "graph_end",
        "hit_at",
        "hits",
        "need",
        "slow",
        "started",
        "tail_end",
        "tolerated",
        "why",
    )

    def __init__(self, need: int = PROBE_CALLS, tolerated: int = SLOW_CALLS_TOLERATED) -> None:
        self.need = need  # good calls still to see
        self.tolerated = tolerated  # slow calls forgiven
        self.slow = 0  # calls past the bounds so far
        self.why = ""  # why the verdict was False: "structure" or "timing"
        self.expected: int | None = None  # the micro-batch the call in progress should be
        self.hits: list[int] = []  # micro-batches whose output hook fired in the call in progress
        self.started = 0.0  # perf_counter at the call
        self.hit_at: float | None = None  # perf_counter when the expected output hook fired
        self.graph_end: float | None = None  # perf_counter when the hooks' end callback ran
        self.tail_end: float | None = None  # perf_counter when the callbacks queued after it had run
        self.after_callbacks = self._after_callbacks  # bound once: queued by the end callback

    def begin(self, expected: int | None) -> None:
        self.expected = expected
        self.hits = []
        self.hit_at = self.graph_end = self.tail_end = None
        self.started = time.perf_counter()

    def hit(self, microbatch: int) -> None:
        if not self.hits:
            self.hit_at = time.perf_counter()
        self.hits.append(microbatch)

    def _after_callbacks(self) -> None:
        """Queued by the hooks' end callback, so it runs after every final callback queued later
        during the backward (the engine runs them first in, first out)."""
        self.tail_end = time.perf_counter()

    def verdict(self) -> bool | None:
        """After a call: True (the wrapper is exact), False (keep hooks), None (keep probing)."""
        hits, expected = self.hits, self.expected
        if expected is None:
            if hits:
                self.why = "structure"
                return False  # an output hook fired in a call with no pending forward
            return None  # a backward of something else while no forward waits: ignored either way
        hit_at, graph_end, tail_end = self.hit_at, self.graph_end, self.tail_end
        if hits != [expected] or hit_at is None or graph_end is None or tail_end is None:
            self.why = "structure"
            return False
        bound = max(_FLOOR, _SHARE * (graph_end - hit_at))
        if hit_at - self.started > bound or tail_end - graph_end > bound:
            self.slow += 1
            if self.slow > self.tolerated:
                self.why = "timing"
                return False
            return None
        self.need -= 1
        return True if self.need <= 0 else None


class BackwardCalls:
    """The process's wrapper around `torch.autograd.backward` and the models it times or probes."""

    def __init__(self) -> None:
        self.owners: list[ModelHooks] = []
        self.depth = 0  # > 0 inside a wrapped call (also read from autograd's device threads)
        self.original: Callable[..., Any] | None = None
        self.wrapper: Callable[..., Any] | None = None

    def add(self, owner: ModelHooks) -> None:
        import torch

        if self.wrapper is None or torch.autograd.backward is not self.wrapper:
            self.original = torch.autograd.backward
            self.wrapper = _wrap(self, self.original)
            torch.autograd.backward = self.wrapper
        if owner not in self.owners:
            self.owners = [*self.owners, owner]  # replaced, not mutated: a call may be iterating

    def discard(self, owner: ModelHooks) -> None:
        import torch

        self.owners = [o for o in self.owners if o is not owner]
        if not self.owners and self.wrapper is not None and torch.autograd.backward is self.wrapper:
            torch.autograd.backward = self.original  # type: ignore[assignment]
            self.wrapper = None
        # Wrapped again by someone else after us: ours stays in their chain, passing calls through.


CALLS = BackwardCalls()


def _wrap(calls: BackwardCalls, original: Callable[..., Any]) -> Callable[..., Any]:
    import torch

    get_ident = threading.get_ident
    dynamo_compiling, compiler = _compiling_checks(torch)

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        owners = calls.owners
        # Not ours when nested (reentrant checkpointing) or compiling: `is_compiling()` in two
        # reads, a Python call fewer (Dynamo answers the first; export sets the second's flag).
        if not owners or calls.depth or dynamo_compiling() or compiler._is_compiling_flag:
            return original(*args, **kwargs)
        ident = get_ident()
        if len(owners) == 1:  # the usual case, without a list per call
            owner = owners[0]
            if owner.thread != ident:
                return original(*args, **kwargs)  # each model's calls come from its own thread
            timed = owner.timed_call
            calls.depth = 1
            try:
                if timed is not None:  # the call times backward: the tracker's timer, one frame
                    return timed(original, args, kwargs)
                owner.call_begin()  # probing (never raises)
                result = original(*args, **kwargs)
            finally:
                calls.depth = 0
            owner.call_end()
            return result
        call = original
        probing = []  # told of the call's end, as they were of its start
        for owner in owners:
            if owner.thread != ident:
                continue
            if owner.timed_call is not None:
                call = _within(owner.timed_call, call)
            else:
                owner.call_begin()
                probing.append(owner)
        calls.depth = 1
        try:
            result = call(*args, **kwargs)
        finally:
            calls.depth = 0
        for owner in probing:
            owner.call_end()
        return result

    return backward


def _compiling_checks(torch: Any) -> tuple[Callable[[], bool], Any]:
    """(`torch.compiler.is_dynamo_compiling`, the module holding `_is_compiling_flag`): together
    what `torch.compiler.is_compiling()` answers. Where a torch lacks either, its `is_compiling`
    and a flag that stays False."""
    compiler = getattr(torch, "compiler", None)
    flag = getattr(compiler, "_is_compiling_flag", None)
    if hasattr(compiler, "is_dynamo_compiling") and isinstance(flag, bool):
        return compiler.is_dynamo_compiling, compiler  # type: ignore[union-attr]
    return getattr(compiler, "is_compiling", lambda: False), _NotCompiling


class _NotCompiling:
    _is_compiling_flag = False


def _within(timed: Callable[..., Any], call: Callable[..., Any]) -> Callable[..., Any]:
    """`call` timed by `timed` (one more model's timer around a call that several models time)."""

    def within(*args: Any, **kwargs: Any) -> Any:
        return timed(call, args, kwargs)

    return within
