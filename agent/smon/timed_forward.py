"""Forward timing without module hooks: the root module instance's class becomes a timed subclass.

Any forward (pre-)hook on a module sends torch's `Module._call_impl` off its fast path (~2 µs per
call here, plus the hooks' own calls with their argument tuples). Instead the root module
*instance* gets a same-named subclass of its class whose `forward` is the timed forward itself
(`StepTracker.timed_forward`, around the class's own `forward`): one Python frame of SMon's per
forward, and `_call_impl` keeps its fast path. The instance is the same object: attributes,
parameters, `state_dict`, `isinstance` and `repr` are unchanged, and a DDP object or the module it
wraps can be the root. Pickling and `copy.deepcopy` give the original class (a copy, e.g. an EMA
model, is not timed), and `restore` puts the original class back.

The subclass is made per attached instance, so its `forward` is bound to that instance's monitor
with no lookup per call, and nothing of SMon's is in the module's `__dict__` to be pickled, copied
or listed. Once restored, nothing refers to the subclass and it is collected with its monitor.
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable
from typing import Any

# The class's own forward -> the timed forward that replaces it: `(module, *args, **kwargs)`,
# which runs the class's forward once, returns its output and raises its exceptions (the
# timer's own errors are counted, never raised).
MakeTimedForward = Callable[[Callable[..., Any]], Callable[..., Any]]


def time_forward(module: Any, make: MakeTimedForward) -> type | None:
    """Swap `module`'s class for a timed subclass; returns the original class, or None if not done.

    Not done (the caller falls back to hooks) when another monitor already times this instance,
    when the instance has its own `forward` attribute (which would shadow the class's), or when
    Python refuses the class assignment.
    """
    original = type(module)
    if "_smon_original" in original.__dict__ or "forward" in getattr(module, "__dict__", {}):
        return None
    try:
        module.__class__ = _timed_class(original, make)
    except TypeError:
        return None
    return original


def restore(module: Any, original: type) -> None:
    """Untime `module`: its original class back. If someone swapped the class again since (FSDP2's
    `fully_shard` makes a subclass of it, and caches that), the timed class stays in their MRO
    but loses its timed `forward`, so nothing there keeps the closed monitor alive or timing."""
    for cls in type(module).__mro__:
        if cls.__dict__.get("_smon_original") is original:
            del cls.forward  # type: ignore[attr-defined]  # the original's forward shows through
            if type(module) is cls:
                module.__class__ = original
            return


def _timed_class(original: type, make: MakeTimedForward) -> type:
    base_forward = original.forward  # type: ignore[attr-defined]
    base_reduce_ex: Any = original.__reduce_ex__
    forward = make(base_forward)

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        return _as_original(base_reduce_ex(self, protocol), timed, original)

    forward.__doc__ = base_forward.__doc__
    forward.__name__ = base_forward.__name__  # stacks (py-spy, the profiler) name the model's forward
    forward.__qualname__ = base_forward.__qualname__
    forward.__wrapped__ = base_forward  # type: ignore[attr-defined]  # inspect.signature sees the original
    namespace = {
        "forward": forward,
        "__reduce_ex__": __reduce_ex__,
        "__module__": original.__module__,
        "__qualname__": original.__qualname__,
        "__doc__": original.__doc__,
        "_smon_original": original,
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
