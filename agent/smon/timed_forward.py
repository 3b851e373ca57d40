"""Forward timing without module hooks: the root module instance's class becomes a timed subclass.

Any forward (pre-)hook on a module sends torch's `Module._call_impl` off its fast path (~2 µs per
call here, plus the hooks' own calls with their argument tuples). Instead the root module
*instance* gets a same-named subclass of its class (made once per class) whose `forward` times
the class's own `forward`; `_call_impl` keeps its fast path. The instance is the same object:
attributes, parameters, `state_dict`, `isinstance` and `repr` are unchanged, and a DDP object or
the module it wraps can be the root. Pickling and `copy.deepcopy` give the original class (a copy,
e.g. an EMA model, is not timed), and `restore` puts the original class back.

The timer of an instance is found by `id()` in a dict rather than stored on the module, so
nothing of SMon's is in the module's `__dict__` to be pickled, copied or listed.
"""

from __future__ import annotations

import copyreg
from typing import Any, Protocol


class ForwardTimer(Protocol):
    """What a timed forward calls around the original one; `begin` returns None to skip timing."""

    def begin(self, module: Any, kwargs: dict[str, Any]) -> Any: ...

    def end(self, began: Any, output: Any) -> None: ...

    def abandon(self, began: Any) -> None: ...


_TIMERS: dict[int, ForwardTimer] = {}  # id(module) -> the timer of that module instance
_TIMED_CLASSES: dict[type, type] = {}  # original class -> its timed subclass


def is_timed(module: Any) -> bool:
    return id(module) in _TIMERS


def time_forward(module: Any, timer: ForwardTimer) -> type | None:
    """Swap `module`'s class for its timed subclass; returns the original class, or None if not done.

    Not done (the caller falls back to hooks) when another monitor already times this instance,
    when the instance has its own `forward` attribute (which would shadow the class's), or when
    Python refuses the class assignment.
    """
    original = type(module)
    if id(module) in _TIMERS or "forward" in getattr(module, "__dict__", {}):
        return None
    timed = _TIMED_CLASSES.get(original)
    if timed is None:
        timed = _TIMED_CLASSES[original] = _timed_class(original)
    _TIMERS[id(module)] = timer
    try:
        module.__class__ = timed
    except TypeError:
        del _TIMERS[id(module)]
        return None
    return original


def restore(module: Any, original: type, timer: ForwardTimer) -> None:
    """Untime `module`: its original class back (unless someone swapped it again since)."""
    if _TIMERS.get(id(module)) is timer:
        del _TIMERS[id(module)]
    if type(module) is _TIMED_CLASSES.get(original):
        module.__class__ = original


def _timed_class(original: type) -> type:
    base_forward = original.forward  # type: ignore[attr-defined]
    base_reduce_ex: Any = original.__reduce_ex__
    timers = _TIMERS

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        timer = timers.get(id(self))
        if timer is None:  # restored, or another instance of the class swapped by someone else
            return base_forward(self, *args, **kwargs)
        began = timer.begin(self, kwargs)
        if began is None:
            return base_forward(self, *args, **kwargs)
        try:
            output = base_forward(self, *args, **kwargs)
        except BaseException:
            timer.abandon(began)
            raise
        timer.end(began, output)
        return output

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        return _as_original(base_reduce_ex(self, protocol), timed, original)

    forward.__doc__ = base_forward.__doc__
    forward.__wrapped__ = base_forward  # type: ignore[attr-defined]  # inspect.signature sees the original
    namespace = {
        "forward": forward,
        "__reduce_ex__": __reduce_ex__,
        "__module__": original.__module__,
        "__qualname__": original.__qualname__,
        "__doc__": original.__doc__,
        "_smon_timed": True,
    }
    timed: type = type(original)(original.__name__, (original,), namespace)
    return timed


def _as_original(reduced: Any, timed: type, original: type) -> Any:
    """A reduce value that rebuilds an instance of `original` where it named the timed class.

    Pickle insists that `copyreg.__newobj__`'s class is the object's own, so that form becomes
    `copyreg._reconstructor` (what protocols 0 and 1 use): plain standard library, nothing of
    SMon's needed to unpickle.
    """
    if not (isinstance(reduced, tuple) and len(reduced) >= 2):
        return reduced
    func, args = reduced[0], reduced[1]
    if not (isinstance(args, tuple) and args and args[0] is timed):
        return reduced
    if func is getattr(copyreg, "__newobj__", None) and len(args) == 1:
        return (copyreg._reconstructor, (original, object, None), *reduced[2:])  # type: ignore[attr-defined]
    return (func, (original, *args[1:]), *reduced[2:])
