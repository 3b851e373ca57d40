"""Forward / backward / gradient-sync timing on a root module and step boundaries from an optimizer.

- forward: the *root* module's `forward`, timed by swapping the instance's class for a timed
  subclass (timed_forward.py: no module hooks, so torch's `_call_impl` keeps its fast path);
  a forward pre-hook and forward hook where that cannot be done. One call = one micro-batch (the
  index is `Span.microbatch`). Forwards with the module in eval mode or with grad disabled are
  recorded as `eval` (they are not training compute).
- backward start: a gradient hook on the forward output, which fires when the gradient w.r.t. that
  output is computed, i.e. right at the start of that micro-batch's backward. The hook and its
  callbacks are made once per micro-batch index and lent to each step's output (`_Backward`).
- backward end: a callback queued on the autograd engine from that hook. The engine runs its final
  callbacks when the backward graph has finished, first in, first out.
- Where a probe shows that each `torch.autograd.backward` call is exactly one pending forward's
  backward, the call itself is timed instead and the hooks are no longer set (backward_calls.py).
- grad_sync (DDP): DDP's reducer queues its own final callback (`finalize_backward`, which waits for
  every bucket's all-reduce and writes the averaged gradients back) when the last bucket becomes
  ready, i.e. after ours was queued. The engine lets a running callback queue more, so the
  backward-end callback queues a second one, which runs once `finalize_backward` has returned.
  [backward end, second callback] is the exposed gradient-sync wait, and no Python runs in DDP's
  reduction path (ddp.py).
- optimizer: step pre/post hooks; the post hook, the tracker's `end_step` itself, ends the training step.

Every hook body is wrapped: an exception is counted and logged once, never raised into training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from smon.backward_calls import CALLS, RECHECK_EVERY, SLOW_PROBES_TOLERATED, Probe
from smon.ddp import SYNC_FLAG, is_ddp
from smon.errors import ErrorCounter
from smon.seqstats import lengths_from_forward_kwargs
from smon.steps import MAX_SPANS_PER_STEP, BackwardTimer, StepTracker
from smon.timed_forward import restore, time_forward
from smon.timing import Mark

if TYPE_CHECKING:
    import torch

_MAX_NESTED_FORWARDS = 8  # forwards that raised leave an entry behind; keep the stack short
logger = logging.getLogger("smon")


def first_grad_tensor(output: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor requiring grad in a forward output (tensor, sequence, mapping)."""
    import torch  # already imported by the caller's process: a dictionary lookup

    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if depth >= 2:
        return None
    if isinstance(output, dict):
        values: Any = list(output.values())[:8]
    elif isinstance(output, (list, tuple)):
        values = output[:8]
    else:
        return None
    for value in values:
        found = first_grad_tensor(value, depth + 1)
        if found is not None:
            return found
    return None


class _Backward:
    """The backward of one micro-batch index of one model chunk, reused every step.

    Its gradient hook and its two engine callbacks are bound once, so a forward hands torch the
    same objects every step instead of new closures (a partial or a dict per forward is training-
    thread time). One micro-batch index has at most one backward in flight: indexes are counted
    per step, and a step's backwards end before the next step's forwards.
    """

    __slots__ = ("ended", "hooks", "microbatch", "owner", "start", "sync", "sync_start", "synced")

    def __init__(self, owner: ModelHooks, microbatch: int) -> None:
        self.owner = owner
        self.microbatch = microbatch
        self.sync = False  # DDP will all-reduce after this backward (set at each forward)
        self.start: Mark = None
        self.sync_start: Mark = None
        self.hooks: dict[str, Any] = {"smon": self.on_output_grad}  # torch's own keys are ints: no clash
        self.ended = self.on_backward_end  # bound once: queued on the engine every step
        self.synced = self.on_sync_end

    def on_output_grad(self, grad: Any) -> None:
        """Backward of this micro-batch starts: the gradient w.r.t. its output exists."""
        owner = self.owner
        tracker = owner._tracker
        if not tracker.active or owner._queue_callback is None or not owner._hook_outputs:
            return None  # (the last: hooked before the call took over; the call times it)
        try:
            if owner._probe is not None:
                owner.probe_hit(self.microbatch)
            self.start = tracker.open("backward")
            owner._queue_callback(self.ended)
        except Exception as exc:
            owner._errors.report("backward_start_hook", exc)
        return None

    def on_backward_end(self) -> None:
        """The backward graph is done (DDP's finalize, if any, runs next)."""
        owner = self.owner
        tracker = owner._tracker
        try:
            if not tracker.active:
                return
            queue = owner._queue_callback
            if self.sync and queue is not None:  # DDP (never probed): grad_sync starts where backward ends
                self.sync_start = tracker.close_and_open(
                    "backward", self.start, self.microbatch, owner.chunk, "grad_sync"
                )
                queue(self.synced)
                return
            tracker.close("backward", self.start, self.microbatch, owner.chunk)
            probe = owner._probe
            if probe is not None and queue is not None:
                probe.graph_end = time.perf_counter()
                queue(probe.after_callbacks)
        except Exception as exc:
            owner._errors.report("backward_end_callback", exc)

    def on_sync_end(self) -> None:
        """DDP's finalize_backward has returned: every bucket's all-reduce is done."""
        owner = self.owner
        tracker = owner._tracker
        try:
            if tracker.active:
                tracker.close("grad_sync", self.sync_start, None, owner.chunk)
            else:
                tracker.discard(self.sync_start)
        except Exception as exc:
            owner._errors.report("grad_sync_callback", exc)


class ModelHooks:
    """Forward / backward / grad_sync spans for one root module (one model chunk of a pipeline stage)."""

    def __init__(self, module: torch.nn.Module, chunk: int, tracker: StepTracker, errors: ErrorCounter):
        import torch

        self.module = module
        self.chunk = chunk
        self._tracker = tracker
        self._errors = errors
        self._torch = torch
        self._is_grad_enabled = torch.is_grad_enabled
        self._tensor_type = torch.Tensor
        self._ddp = is_ddp(module)
        self._forwards: list[tuple[str, Mark, int | None]] = []
        self._queue_callback: Callable[[Callable[[], None]], None] | None = getattr(
            getattr(torch.autograd.Variable, "_execution_engine", None), "queue_callback", None
        )
        self._handles: list[Any] = []
        self._original_class: type | None = None  # set while the module's class is swapped
        self._backwards: list[_Backward] = []  # by micro-batch index
        # How backward is timed: "hooks" (output hook and engine callbacks), "probe" (hooks, while
        # the torch.autograd.backward wrapper checks it sees the same backwards), "calls" (the
        # wrapper alone) or "recheck" (hooks again for one call, then back to "calls" if it still
        # matches). See backward_calls.py.
        self.backward_timing = "hooks"
        self._probe: Probe | None = None
        self._hook_outputs = True  # False while the wrapper times backward
        self._slow_probes = 0  # probes that failed only on time
        # Training forwards before `after_forward` runs: 0 (every forward) while outputs are
        # hooked, RECHECK_EVERY once the wrapper times backward (then a re-probe is due).
        self.forwards_until_after = 0
        self.thread = threading.get_ident()  # backward calls from other threads are not this model's
        # While the call times backward: the tracker's timer the wrapper runs the call in.
        self.timed_call: BackwardTimer | None = None

    def install(self) -> None:
        tracker, errors = self._tracker, self._errors
        self._original_class = time_forward(
            self.module,
            lambda forward: tracker.timed_forward(
                self.chunk, self, forward, self._is_grad_enabled, errors.report
            ),
        )
        if self._original_class is None:
            self._handles = [
                self.module.register_forward_pre_hook(self._on_forward_pre, with_kwargs=True),
                self.module.register_forward_hook(self._on_forward),
            ]
        if not self._ddp and self._queue_callback is not None and not self._tracker.clock.device:
            self._probe = Probe()
            self.backward_timing = "probe"
            CALLS.add(self)

    def remove(self) -> None:
        CALLS.discard(self)
        self._probe = None
        if self._original_class is not None:
            restore(self.module, self._original_class)
            self._original_class = None
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- forward: the tracker's timed_forward where the module's class is swapped; else the hooks
    # below, through begin / end ----------------------------------------------------------------
    def begin(self, module: Any, kwargs: dict[str, Any]) -> tuple[str, Mark, int | None] | None:
        """A forward starts: (kind, start mark, micro-batch), or None when not timing."""
        tracker = self._tracker
        if not tracker.active:
            return None
        try:
            if module.training and self._is_grad_enabled():
                microbatch, start = tracker.open_forward(self.chunk)
                kind = "forward"
            else:
                microbatch, kind, start = None, "eval", tracker.open("eval")
            if kwargs and microbatch is not None and tracker.timed:
                lengths = lengths_from_forward_kwargs(kwargs, tracker.device_event)
                if lengths is not None:
                    tracker.add_seq(lengths, microbatch, explicit=False)
            return kind, start, microbatch
        except Exception as exc:
            self._errors.report("forward_pre_hook", exc)
            return None

    def end(self, began: tuple[str, Mark, int | None], output: Any) -> None:
        """The forward returned `output`: close its span, then as the tracker's timed forward does."""
        tracker = self._tracker
        try:
            kind, start, microbatch = began
            if not tracker.active:
                tracker.abandon_forward(start)
                return
            tracker.close_forward(kind, start, microbatch, self.chunk)
            if microbatch is not None:
                self.forwards_until_after -= 1
                if self.forwards_until_after <= 0:
                    self.after_forward(microbatch, output)
        except Exception as exc:
            self._errors.report("forward_hook", exc)

    def after_forward(self, microbatch: int, output: Any) -> None:
        """After a training forward, once `forwards_until_after` has counted down: hook the start
        of its backward (every forward while hooks time backward), or, while the wrapper times
        it, probe this forward's backward again if none is pending (else the next forward's)."""
        if not self._hook_outputs:
            if self._tracker.paired_backwards(self.chunk) != microbatch:
                return  # a backward is pending: the call would not be this forward's alone
            self._recheck()  # nothing pending: this forward's backward is probed again
        if self._queue_callback is None:
            return
        if type(output) is self._tensor_type:  # the usual case, without a call
            tensor = output if output.requires_grad else None
        else:
            tensor = first_grad_tensor(output)
        if tensor is None:
            return
        backwards = self._backwards
        if microbatch < len(backwards):
            backward = backwards[microbatch]
        elif microbatch < MAX_SPANS_PER_STEP:
            backwards.extend(_Backward(self, i) for i in range(len(backwards), microbatch + 1))
            backward = backwards[microbatch]
        else:
            return  # past the step's span cap: the backward would not be recorded
        backward.sync = self._ddp and bool(getattr(self.module, SYNC_FLAG, True))
        # Have backward.hooks["smon"] called with the gradient w.r.t. `tensor` (the start of its
        # backward). `tensor.register_hook` builds a new OrderedDict and a RemovableHandle per
        # call, and a tensor still holding a hook dict when it is freed costs more again (~7 µs a
        # forward in a small loop). Instead a plain tensor with no hooks of its own lends its
        # `_backward_hooks` slot for one call: the grad_fn registers SMon's dict (made once,
        # reused every step) as register_hook would have registered a new one, and the slot is
        # emptied again (~3 µs). The dict never shows on the tensor: a user's later register_hook
        # makes the tensor its own dict, so their hooks neither land in SMon's nor run for other
        # steps. Anything else (tensor subclasses, tensors with hooks already, leaves) takes the
        # public call. Inlined, as is reading DDP's flag above: this runs on every training
        # forward while hooks time backward (always under DDP).
        grad_fn = tensor.grad_fn
        if (
            type(tensor) is self._tensor_type
            and tensor._backward_hooks is None
            and grad_fn is not None
            and hasattr(grad_fn, "_register_hook_dict")
        ):
            tensor._backward_hooks = backward.hooks  # type: ignore[assignment]  # a str key: no clash with torch's ints
            try:
                grad_fn._register_hook_dict(tensor)
            finally:  # never leave SMon's shared dict on the user's tensor
                tensor._backward_hooks = None
        else:
            tensor.register_hook(backward.hooks["smon"])

    # -- torch.autograd.backward calls (backward_calls.py) --------------------------------------
    def _set_call_timing(self, by_calls: bool) -> None:
        """While the calls time backward, the wrapper runs each call in the tracker's timer
        (`timed_call`: one Python frame of SMon's per backward) and a re-probe is due after
        RECHECK_EVERY forwards; otherwise it calls `call_begin` / `call_end` around the call, and
        `after_forward` hooks every forward's output."""
        if by_calls:
            self.forwards_until_after = RECHECK_EVERY
            self.timed_call = self._tracker.timed_backward(self.chunk, self._errors.report)
        else:
            self.forwards_until_after = 0
            self.timed_call = None

    def call_begin(self) -> None:
        """A backward call starts while probing: the probe watches it, the hooks time it."""
        tracker = self._tracker
        if not tracker.active:
            return
        try:
            probe = self._probe
            if probe is not None:  # (None only once hooks stay for good: no longer called then)
                probe.begin(tracker.next_backward(self.chunk))
        except Exception as exc:
            self._errors.report("backward_call", exc)

    def call_end(self) -> None:
        """A backward call returned while probing: the probe's verdict, if it has one."""
        try:
            probe = self._probe
            if probe is not None and self._tracker.active:
                verdict = probe.verdict()
                if verdict is True:
                    self._probe = None
                    self._hook_outputs = False
                    self._set_call_timing(True)
                    if self.backward_timing != "recheck":
                        logger.debug("smon: model chunk %d: backward timed by its calls", self.chunk)
                    self.backward_timing = "calls"
                elif verdict is False:
                    if probe.why == "timing" and self._slow_probes < SLOW_PROBES_TOLERATED:
                        self._slow_probes += 1
                        self._probe = Probe()  # perhaps a preempted thread: probe afresh
                        self._hook_outputs = True
                        self.backward_timing = "probe"
                    else:
                        self.keep_hooks(f"backward calls that do not match the hooks ({probe.why})")
        except Exception as exc:
            self._errors.report("backward_call", exc)

    def probe_hit(self, microbatch: int) -> None:
        """An output hook fired while probing (autograd may call it from a device thread)."""
        probe = self._probe
        if probe is None:
            return
        if CALLS.depth == 0:
            self.keep_hooks("backward entered without torch.autograd.backward")
        else:
            probe.hit(microbatch)

    def _recheck(self) -> None:
        """Probe one call again (hooks time it meanwhile): the loop may have changed since."""
        self._probe = Probe(need=1, tolerated=0)
        self._hook_outputs = True
        self._set_call_timing(False)
        self.backward_timing = "recheck"

    def keep_hooks(self, why: str) -> None:
        """The wrapper cannot time this model's backward exactly: hooks time it from now on."""
        self._probe = None
        self._hook_outputs = True
        self._set_call_timing(False)
        self.backward_timing = "hooks"
        CALLS.discard(self)
        logger.debug("smon: model chunk %d: backward stays timed by hooks (%s)", self.chunk, why)

    # -- hooks (modules whose class cannot be swapped) ------------------------------------------
    def _on_forward_pre(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        began = self.begin(module, kwargs)
        if began is not None:
            forwards = self._forwards
            if len(forwards) >= _MAX_NESTED_FORWARDS:
                forwards.clear()
            forwards.append(began)
        return None

    def _on_forward(self, module: Any, args: Any, output: Any) -> None:
        if self._forwards:
            self.end(self._forwards.pop(), output)
        return None


class OptimizerHooks:
    """`optimizer` span and step boundary: a step ends when `optimizer.step()` returns.

    The hook bodies are the tracker's (`StepTracker.optimizer_step_hooks`), which do the phase
    bookkeeping inline: they run on every step."""

    def __init__(self, optimizer: Any, tracker: StepTracker, errors: ErrorCounter):
        self.optimizer = optimizer
        self._pre, self._post = tracker.optimizer_step_hooks(errors.report)
        self._handles: list[Any] = []

    def install(self) -> None:
        self._handles = [
            self.optimizer.register_step_pre_hook(self._pre),
            self.optimizer.register_step_post_hook(self._post),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
