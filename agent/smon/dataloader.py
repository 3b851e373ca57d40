"""Time blocked in `next()` on a data loader's iterator (`data_wait`), without touching the user's loop.

`for batch in loader:` must keep working exactly as written, so the loader object is not
replaced: its class is swapped for a same-named subclass whose `__iter__` swaps the returned
iterator's class in turn for a subclass whose `__next__` is timed. Same objects, same attributes,
`isinstance` still true, `len()` and persistent workers untouched. Iterators whose class cannot be
swapped (generators, C iterators) are wrapped in a small delegating proxy instead. `close()`
restores the loader's class.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from smon.errors import ErrorCounter, OnceLog
from smon.steps import StepTracker

logger = logging.getLogger("smon")


class DataWaitTimer:
    def __init__(self, tracker: StepTracker, errors: ErrorCounter, once: OnceLog) -> None:
        self._tracker = tracker
        self._errors = errors
        self._once = once
        self._iterator_classes: dict[type, type | None] = {}
        self._wrapped: list[tuple[Any, type]] = []  # (loader, its original class)

    @property
    def active(self) -> bool:
        return self._tracker.active

    def wrap_loader(self, loader: Any) -> bool:
        """Make `loader`'s iterators timed; False (said once) if its class cannot be swapped."""
        original = type(loader)
        if getattr(original, "_smon_timed_loader", False):
            return True  # attached twice: the first wrapper already times it
        timer = self

        def __iter__(self: Any) -> Any:
            iterator = original.__iter__(self)
            if not timer.active:
                return iterator
            try:
                return timer.wrap_iterator(iterator)
            except Exception as exc:
                timer._errors.report("dataloader_iter", exc)
                return iterator

        namespace = {
            "__iter__": __iter__,
            "__module__": original.__module__,
            "__qualname__": original.__qualname__,
            "__doc__": original.__doc__,
            "_smon_timed_loader": True,
        }
        try:
            loader.__class__ = type(original.__name__, (original,), namespace)
        except TypeError as exc:
            self._once(
                "dataloader_unwrappable",
                logging.WARNING,
                "smon: cannot time data loading for a %s (%s); data_wait will not be recorded",
                original.__name__,
                exc,
            )
            return False
        self._wrapped.append((loader, original))
        return True

    def restore(self) -> None:
        for loader, original in self._wrapped:
            with contextlib.suppress(TypeError):
                loader.__class__ = original
        self._wrapped = []

    def wrap_iterator(self, iterator: Any) -> Any:
        base = type(iterator)
        if getattr(base, "_smon_timer", None) is self:
            return iterator  # persistent workers: DataLoader hands back the same iterator
        base = getattr(base, "_smon_base", base)  # timed by an earlier, closed monitor
        if base not in self._iterator_classes:
            try:
                self._iterator_classes[base] = self._iterator_class(base)
            except TypeError:  # generators and other final C types cannot be subclassed
                self._iterator_classes[base] = None
        timed = self._iterator_classes[base]
        if timed is not None:
            try:
                iterator.__class__ = timed
                return iterator
            except TypeError:
                self._iterator_classes[base] = None
        return _TimedIteratorProxy(iterator, self)

    def _iterator_class(self, base: type) -> type:
        return type(
            base.__name__,
            (base,),
            {
                "__next__": self.timed(base.__next__),  # type: ignore[attr-defined]
                "__module__": base.__module__,
                "__qualname__": base.__qualname__,
                "_smon_timer": self,
                "_smon_base": base,
            },
        )

    def timed(self, next_fn: Any) -> Any:
        """`next_fn` (an iterator -> its next item) timed: the time blocked in it is a `data_wait` span.

        One closure, made once per iterator class (the tracker's, which records the span inline):
        it is the class's `__next__` itself, so a batch costs one Python call on top of the
        loader's own."""
        return self._tracker.timed_next(next_fn, self._errors.report)


class _TimedIteratorProxy:
    """Fallback for iterators whose class cannot be swapped: times `next()`, delegates the rest."""

    def __init__(self, iterator: Any, timer: DataWaitTimer) -> None:
        self._smon_iterator = iterator
        self._smon_next = timer.timed(next)

    def __iter__(self) -> _TimedIteratorProxy:
        return self

    def __next__(self) -> Any:
        return self._smon_next(self._smon_iterator)

    def __len__(self) -> int:
        return len(self._smon_iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._smon_iterator, name)
