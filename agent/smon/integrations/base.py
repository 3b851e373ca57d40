"""What the framework integrations share: the job's name, the framework's optimizer unwrapped to
the torch one, and framework methods timed as named phases (`eval`, `checkpoint`, `log`).

Nothing here imports a framework. Every call that touches framework objects is guarded: an
integration that cannot find what it looks for says so once and monitors less, it never stops
training.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from smon.api import attach
from smon.monitor import Monitor

logger = logging.getLogger("smon")

# Framework phases (DESIGN §6): the server diagnoses them by these names, not as `host_work`.
EVAL = "eval"
CHECKPOINT = "checkpoint"
LOG = "log"


def job_name(run_name: Any) -> str | None:
    """The job id an integration passes to attach: None when SMON_JOB is set (attach reads it),
    else the framework's run name, else None (attach's own default: TORCHELASTIC_RUN_ID, ...)."""
    if os.environ.get("SMON_JOB", "").strip():
        return None
    name = str(run_name).strip() if run_name is not None else ""
    return name or None


def torch_optimizer(optimizer: Any) -> Any:
    """The innermost torch optimizer inside a framework's wrappers (Accelerate's
    `AcceleratedOptimizer` is one itself and holds the real one as `.optimizer`; Lightning's
    `LightningOptimizer` holds it as `._optimizer`), whose step hooks fire once per real optimizer
    step: a wrapper's `step()` that gradient accumulation skips never reaches it. None if there
    is none (DeepSpeed's ZeRO optimizers are no torch optimizers)."""
    try:
        from torch.optim import Optimizer
    except ImportError:
        return None
    found = optimizer if isinstance(optimizer, Optimizer) else None
    for _ in range(8):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
        if isinstance(inner, Optimizer):
            found = inner
    return found


def torch_loader(loader: Any) -> Any:
    """The torch DataLoader a framework's loader iterates (Accelerate's `DataLoaderShard` and
    `DataLoaderDispatcher` keep it as `base_dataloader` and cannot have their class swapped)."""
    for _ in range(4):
        inner = getattr(loader, "base_dataloader", None)
        if inner is None or inner is loader:
            break
        loader = inner
    return loader


def start(framework: str, **kwargs: Any) -> Monitor:
    """`smon.attach(**kwargs)`, said once in the log with the framework's name."""
    monitor = attach(**kwargs)
    if monitor.enabled:
        logger.info("smon: monitoring %s training (job %s)", framework, getattr(monitor, "job", "?"))
    return monitor


class PhaseTimers:
    """Framework methods timed as phases, on the instance (the class is left alone), and put back."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._wrapped: list[tuple[Any, str, bool, Any]] = []

    def wrap(self, owner: Any, method: str, phase: str) -> bool:
        """Time every call of `owner.method` as `phase`. False when there is no such method."""
        if owner is None or not self.monitor.enabled:
            return False
        try:
            original = getattr(owner, method, None)
            if not callable(original):
                return False
            had_own = method in getattr(owner, "__dict__", {})
            previous = owner.__dict__.get(method) if had_own else None
            setattr(owner, method, _timed(original, self.monitor, phase))
            self._wrapped.append((owner, method, had_own, previous))
            return True
        except Exception as exc:  # a read-only or slotted object: monitor without that phase
            logger.info("smon: cannot time %s.%s as %r (%r)", type(owner).__name__, method, phase, exc)
            return False

    def restore(self) -> None:
        for owner, method, had_own, previous in reversed(self._wrapped):
            try:
                if had_own:
                    setattr(owner, method, previous)
                else:
                    delattr(owner, method)
            except Exception as exc:
                logger.info("smon: could not restore %s.%s (%r)", type(owner).__name__, method, exc)
        self._wrapped.clear()


def _timed(original: Callable[..., Any], monitor: Monitor, phase: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with monitor.phase(phase):
            return original(*args, **kwargs)

    return timed


class OpenPhase:
    """A phase opened and closed by two framework hooks (Lightning's on_validation_start / _end)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._scope: AbstractContextManager[Any] | None = None

    def begin(self, monitor: Monitor) -> None:
        if self._scope is None and monitor.enabled:
            self._scope = monitor.phase(self.name)
            self._scope.__enter__()

    def end(self) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.__exit__(None, None, None)
