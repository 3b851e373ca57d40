"""Backward timed from the call to `torch.autograd.backward`, once a probe has shown it is exact.

The gradient hook on a forward's output (hooks.py) times backward from inside autograd: the engine
calls into Python at the start of that micro-batch's backward and again for the end callback, each
a GIL round trip with a wrapped tensor. That is most of SMon's training-thread cost on a small
step. Most training loops start backward with `loss.backward()` or `torch.autograd.backward(...)`,
and `Tensor.backward` calls the latter, so a wrapper around that function sees the same backward
for two clock readings and no engine crossing (~60% fewer instructions per step for the whole
agent on the benchmark's tiny loop).

The wrapper is only exact where each call is the backward of one pending training forward, so a
model starts on hooks and the wrapper watches (`Probe`). It takes over after `PROBE_CALLS` calls
in which:
- the output hook of the next pending micro-batch fired inside the call, and nothing else did;
- no output hook fired outside a call (Megatron's pipeline schedules enter the engine directly);
- no final callback queued by someone else after the hooks' own (FSDP's post-backward, say) ran
  for long inside the call: hooks end backward before it, the call after it.
Any other sight (a stray backward of another graph, two micro-batches in one call, `autograd.grad`
through the output, a second backward of the same graph) keeps the hooks for good. DDP models
never probe: their exposed gradient-sync wait needs the engine callback between the end of the
graph and DDP's `finalize_backward` (ddp.py).

Timed by the wrapper, backward starts where `backward()` is called, so the loss's own backward is
in it; under hooks it started at the model output's gradient. Both are compute; the difference is
the (small) loss backward, once, at the switch, on every rank alike.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smon.hooks import ModelHooks

PROBE_CALLS = 8  # consecutive calls that must match the hooks before the wrapper takes over
# Final callbacks queued by others after the hooks' own may take this long (s), or this share of
# the backward, before the call is taken to hold work that hooks would not count as backward.
_TAIL_FLOOR = 100e-6
_TAIL_SHARE = 0.05


class Probe:
    """What the wrapper saw of one model's backwards while hooks still time them."""

    __slots__ = (
        "after_callbacks",
        "backwards",
        "expected",
        "good",
        "graph_end",
        "hits",
        "started",
        "tail_end",
        "tails",
    )

    def __init__(self) -> None:
        self.good = 0
        self.expected: int | None = None  # the micro-batch the call in progress should be
        self.hits: list[int] = []  # micro-batches whose output hook fired in the call in progress
        self.started = 0.0  # perf_counter at the call
        self.graph_end: float | None = None  # perf_counter when the hooks' end callback ran
        self.tail_end: float | None = None  # perf_counter when the callbacks queued after it had run
        self.tails: list[float] = []  # tail_end - graph_end, per good call
        self.backwards: list[float] = []  # graph_end - started, per good call
        self.after_callbacks = self._after_callbacks  # bound once: queued by the end callback

    def begin(self, expected: int | None) -> None:
        self.expected = expected
        self.hits = []
        self.graph_end = self.tail_end = None
        self.started = time.perf_counter()

    def _after_callbacks(self) -> None:
        """Queued by the hooks' end callback, so it runs after every final callback queued later
        during the backward (the engine runs them first in, first out)."""
        self.tail_end = time.perf_counter()

    def verdict(self) -> bool | None:
        """After a call: True (the wrapper is exact), False (keep hooks), None (keep probing)."""
        hits, expected = self.hits, self.expected
        if expected is None:
            if hits:
                return False  # an output hook fired in a call with no pending forward
            return None  # a backward of something else while no forward waits: ignored either way
        if hits != [expected] or self.graph_end is None or self.tail_end is None:
            return False
        self.tails.append(self.tail_end - self.graph_end)
        self.backwards.append(self.graph_end - self.started)
        self.good += 1
        if self.good < PROBE_CALLS:
            return None
        tail = statistics.median(self.tails)
        return tail <= max(_TAIL_FLOOR, _TAIL_SHARE * statistics.median(self.backwards))


class BackwardCalls:
    """The process's wrapper around `torch.autograd.backward` and the models it times or probes."""

    def __init__(self) -> None:
        self.owners: list[ModelHooks] = []
        self.depth = 0  # > 0 inside a wrapped call (also read from autograd's device threads)
        self.thread: int | None = None  # calls from other threads pass through
        self.original: Callable[..., Any] | None = None
        self.wrapper: Callable[..., Any] | None = None

    def add(self, owner: ModelHooks) -> None:
        import torch

        if self.wrapper is None or torch.autograd.backward is not self.wrapper:
            self.original = torch.autograd.backward
            self.wrapper = _wrap(self, self.original)
            torch.autograd.backward = self.wrapper
        self.thread = threading.get_ident()
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
    get_ident = threading.get_ident

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        owners = calls.owners
        if not owners or calls.depth or get_ident() != calls.thread:
            return original(*args, **kwargs)  # nested (reentrant checkpointing), or not ours
        if len(owners) == 1:  # the usual case, without a list per call
            owner = owners[0]
            token = owner.call_begin()
            calls.depth = 1
            try:
                result = original(*args, **kwargs)
            except BaseException:
                calls.depth = 0
                owner.call_abandon(token)
                raise
            calls.depth = 0
            owner.call_end(token)
            return result
        tokens = [(owner, owner.call_begin()) for owner in owners]
        calls.depth = 1
        try:
            result = original(*args, **kwargs)
        except BaseException:
            calls.depth = 0
            for owner, token in tokens:
                owner.call_abandon(token)
            raise
        calls.depth = 0
        for owner, token in tokens:
            owner.call_end(token)
        return result

    return backward
