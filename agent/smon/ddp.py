"""Exposed gradient-sync time under DistributedDataParallel, through a timing comm hook.

DDP all-reduces gradient buckets while backward is still computing; only the part of that
communication that backward could not hide delays the step. SMon therefore defines
`grad_sync` as the *exposed* wait: from the moment the last bucket becomes ready (backward
compute is over: the comm hook is called with `bucket.is_last()`) until the last all-reduce future
of the iteration completes (DDP's finalize waits for exactly that before `backward()` returns).

The hook wraps DDP's default all-reduce (`default_hooks.allreduce_hook`), which is numerically the
built-in path: divide each bucket by the group size, then all-reduce sum. A DDP model accepts one
comm hook only: if the user registered one before attach, SMon says so once and skips grad_sync;
if the user registers one *after* attach, SMon's wrapper takes it as its inner hook, so the user's
call still succeeds and their hook still runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from smon.errors import ErrorCounter, OnceLog
from smon.hooks import ModelHooks
from smon.steps import StepTracker
from smon.timing import Mark

logger = logging.getLogger("smon")


def is_ddp(module: Any) -> bool:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except Exception:
        return False
    return isinstance(module, DistributedDataParallel)


def attach_ddp(
    ddp: Any, model_hooks: ModelHooks, tracker: StepTracker, errors: ErrorCounter, once: OnceLog
) -> DdpSyncHook | None:
    """Time grad_sync on `ddp`; reuses the hook a previous (closed) monitor left registered."""
    previous = getattr(ddp, "_smon_sync_hook", None)
    if isinstance(previous, DdpSyncHook):
        previous.rebind(model_hooks, tracker, errors)
        return previous
    sync = DdpSyncHook(ddp, model_hooks, tracker, errors, once)
    return sync if sync.install() else None


class DdpSyncHook:
    """Registers the timing comm hook on one DDP module and records `grad_sync` spans.

    DDP cannot unregister a comm hook, so after `remove()` the hook stays as a pass-through to the
    inner all-reduce, and a later attach on the same model re-arms it (`rebind`).
    """

    def __init__(
        self, ddp: Any, model_hooks: ModelHooks, tracker: StepTracker, errors: ErrorCounter, once: OnceLog
    ) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ddp = ddp
        self._model_hooks = model_hooks
        self._tracker = tracker
        self._errors = errors
        self._once = once
        self._default_hooks = default_hooks
        self._inner: Callable[[Any, Any], Any] = default_hooks.allreduce_hook
        self._inner_state: Any = ddp.process_group
        self._lock = threading.Lock()
        self._inflight = 0
        self._sync_start: Mark | None = None
        self.active = False

    def install(self) -> bool:
        """Register the hook; False (said once) when DDP already has one."""
        existing = getattr(self.ddp, "_comm_hooks", None)
        if existing:
            names = ", ".join(getattr(h, "__qualname__", repr(h)) for h, _ in existing)
            self._once(
                "ddp_comm_hook_taken",
                logging.WARNING,
                "smon: this DDP model already has a comm hook (%s); exposed grad_sync time will "
                "not be measured",
                names,
            )
            return False
        # No annotations: DDP checks hook annotations by identity and would refuse string ones.
        hook = lambda state, bucket: self._timed_hook(state, bucket)  # noqa: E731
        try:
            self.ddp.register_comm_hook(state=self._inner_state, hook=hook)
        except Exception as exc:
            hooks_list = getattr(self.ddp, "_comm_hooks", None)
            if hooks_list and hooks_list[-1][0] is hook:
                hooks_list.pop()  # DDP records the hook before it finds out it cannot take it
            self._once(
                "ddp_comm_hook_taken",
                logging.WARNING,
                "smon: could not register a DDP comm hook (%s); exposed grad_sync time will not be measured",
                exc,
            )
            return False
        # Later user registrations become the inner hook instead of failing ("only once").
        self.ddp.register_comm_hook = self._user_register_comm_hook
        self.ddp._register_builtin_comm_hook = self._user_register_builtin_comm_hook
        self.ddp._smon_sync_hook = self
        self.active = True
        return True

    def rebind(self, model_hooks: ModelHooks, tracker: StepTracker, errors: ErrorCounter) -> None:
        with self._lock:
            self._model_hooks, self._tracker, self._errors = model_hooks, tracker, errors
            self._inflight, self._sync_start = 0, None
            self.active = True

    def remove(self) -> None:
        self.active = False  # the hook stays registered as a pass-through

    # -- user registrations after attach ----------------------------------------------------
    def _user_register_comm_hook(self, state: Any, hook: Callable[[Any, Any], Any]) -> None:
        check = getattr(self.ddp, "_check_comm_hook", None)
        if check is not None:
            check(hook)
        self._inner, self._inner_state = hook, state
        self._once(
            "ddp_user_hook",
            logging.INFO,
            "smon: DDP comm hook %s runs inside SMon's grad_sync timing wrapper",
            getattr(hook, "__qualname__", repr(hook)),
        )

    def _user_register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        import torch.distributed as dist

        builtin = {
            dist.BuiltinCommHookType.ALLREDUCE: self._default_hooks.allreduce_hook,
            dist.BuiltinCommHookType.FP16_COMPRESS: self._default_hooks.fp16_compress_hook,
        }
        hook = builtin.get(comm_hook_type)
        if hook is None:
            raise RuntimeError(f"smon: builtin comm hook {comm_hook_type} is not supported under SMon")
        self._user_register_comm_hook(self.ddp.process_group, hook)

    # -- the hook -----------------------------------------------------------------------------
    def _timed_hook(self, state: Any, bucket: Any) -> Any:
        inner, inner_state = self._inner, self._inner_state
        if not (self.active and self._tracker.active):
            return inner(inner_state, bucket)
        try:
            last = bucket.is_last()
            with self._lock:
                self._inflight += 1
                if last:
                    start = self._tracker.open("grad_sync")
                    self._sync_start = start
            if last:
                self._model_hooks.note_compute_end(start)
        except Exception as exc:
            self._errors.report("ddp_comm_hook", exc)
            return inner(inner_state, bucket)
        future = inner(inner_state, bucket)
        try:
            return future.then(self._on_bucket_done)
        except Exception as exc:
            self._errors.report("ddp_comm_hook", exc)
            return future

    def _on_bucket_done(self, future: Any) -> Any:
        # Runs on the process group's thread when one bucket's all-reduce completes. With CUDA
        # tensors it runs on a stream synchronized with the collective, so a CUDA mark taken here
        # completes when the collective does.
        try:
            start: Mark | None = None
            with self._lock:
                self._inflight -= 1
                if self._inflight <= 0 and self._sync_start is not None:
                    start, self._sync_start = self._sync_start, None
                    self._inflight = 0
            if start is not None:
                self._tracker.close("grad_sync", start, None, self._model_hooks.chunk)
        except Exception as exc:
            self._errors.report("ddp_comm_hook_done", exc)
        return future.value()  # the reduced bucket; an all-reduce error propagates to DDP as before
