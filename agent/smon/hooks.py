"""Forward / backward timing on a root module and step boundaries from an optimizer.

- forward: a forward pre-hook and a forward hook on the *root* module (one call = one
  micro-batch; the index is `Span.microbatch`). Forwards with the module in eval mode or with
  grad disabled are recorded as `eval` (they are not training compute).
- backward start: a tensor hook on the forward output, which fires when the gradient w.r.t. that
  output is computed, i.e. right at the start of that micro-batch's backward.
- backward end: a callback queued on the autograd engine from that hook, which runs when the
  backward graph has finished (the engine's own final-callback mechanism, also used by DDP and
  FSDP). Under DDP the end is instead the moment the last gradient bucket became ready (ddp.py),
  which excludes the time DDP then waits for its all-reduces.
- optimizer: step pre/post hooks; the post hook ends the training step.

Every hook body is wrapped: an exception is counted and logged once, never raised into training.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from smon.errors import ErrorCounter
from smon.seqstats import lengths_from_forward_kwargs
from smon.steps import StepTracker
from smon.timing import Mark

if TYPE_CHECKING:
    import torch

_MAX_NESTED_FORWARDS = 8  # forwards that raised leave an entry behind; keep the stack short


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


class ModelHooks:
    """Forward / backward spans for one root module (one model chunk of a pipeline stage)."""

    def __init__(self, module: torch.nn.Module, chunk: int, tracker: StepTracker, errors: ErrorCounter):
        import torch

        self.module = module
        self.chunk = chunk
        self._tracker = tracker
        self._errors = errors
        self._torch = torch
        self._forwards: list[tuple[str, Mark, int | None]] = []
        self._open_backwards = 0
        self._compute_end: Mark | None = None  # set by the DDP comm hook at the last bucket
        self._queue_callback: Callable[[Callable[[], None]], None] | None = getattr(
            getattr(torch.autograd.Variable, "_execution_engine", None), "queue_callback", None
        )
        self._handles: list[Any] = []

    def install(self) -> None:
        self._handles = [
            self.module.register_forward_pre_hook(self._on_forward_pre, with_kwargs=True),
            self.module.register_forward_hook(self._on_forward),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def note_compute_end(self, mark: Mark) -> None:
        """The last DDP bucket is ready: backward compute of the open backward ends here."""
        if self._open_backwards > 0:
            self._compute_end = mark

    # -- hooks ------------------------------------------------------------------------------
    def _on_forward_pre(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        tracker = self._tracker
        if not tracker.active:
            return None
        try:
            if module.training and self._torch.is_grad_enabled():
                microbatch: int | None = tracker.begin_forward(self.chunk)
                kind = "forward"
            else:
                microbatch, kind = None, "eval"
            start = tracker.open(kind)
            if len(self._forwards) >= _MAX_NESTED_FORWARDS:
                self._forwards.clear()
            self._forwards.append((kind, start, microbatch))
            if kwargs and microbatch is not None:
                lengths = lengths_from_forward_kwargs(kwargs)
                if lengths is not None:
                    tracker.add_seq(lengths, microbatch, explicit=False)
        except Exception as exc:
            self._errors.report("forward_pre_hook", exc)
        return None

    def _on_forward(self, module: Any, args: Any, output: Any) -> None:
        tracker = self._tracker
        if not tracker.active or not self._forwards:
            return None
        try:
            kind, start, microbatch = self._forwards.pop()
            tracker.close(kind, start, microbatch, self.chunk)
            tracker.end_forward()
            if kind == "forward" and self._queue_callback is not None:
                tensor = first_grad_tensor(output)
                if tensor is not None:
                    tensor.register_hook(self._backward_start_hook(microbatch))
        except Exception as exc:
            self._errors.report("forward_hook", exc)
        return None

    def _backward_start_hook(self, microbatch: int | None) -> Callable[[Any], None]:
        def on_output_grad(grad: Any) -> None:
            if not self._tracker.active or self._queue_callback is None:
                return None
            try:
                start = self._tracker.open("backward")
                self._open_backwards += 1
                self._queue_callback(lambda: self._on_backward_end(start, microbatch))
            except Exception as exc:
                self._errors.report("backward_start_hook", exc)
            return None

        return on_output_grad

    def _on_backward_end(self, start: Mark, microbatch: int | None) -> None:
        try:
            self._open_backwards = max(0, self._open_backwards - 1)
            end, self._compute_end = self._compute_end, None
            if self._tracker.active:
                self._tracker.close("backward", start, microbatch, self.chunk, end=end)
        except Exception as exc:
            self._errors.report("backward_end_callback", exc)


class OptimizerHooks:
    """`optimizer` span and step boundary: a step ends when `optimizer.step()` returns."""

    def __init__(self, optimizer: Any, tracker: StepTracker, errors: ErrorCounter):
        self.optimizer = optimizer
        self._tracker = tracker
        self._errors = errors
        self._start: Mark | None = None
        self._handles: list[Any] = []

    def install(self) -> None:
        self._handles = [
            self.optimizer.register_step_pre_hook(self._on_step_pre),
            self.optimizer.register_step_post_hook(self._on_step_post),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._tracker.active:
            return None
        try:
            self._start = self._tracker.open("optimizer")
        except Exception as exc:
            self._errors.report("optimizer_pre_hook", exc)
        return None

    def _on_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker = self._tracker
        if not tracker.active:
            return None
        try:
            end = None
            if self._start is not None:
                end = tracker.close("optimizer", self._start)
                self._start = None
            tracker.end_step(end=end)
        except Exception as exc:
            self._errors.report("optimizer_post_hook", exc)
        return None
