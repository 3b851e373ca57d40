"""Give freed memory back to the OS between the stages of a pass.

A cold pass over a 4,096-rank window frees hundreds of megabytes of chunk-sized arrays (a few to
tens of MB each: the records and spans of 64 steps, the op table pieces). glibc keeps arrays
below its mmap threshold, which rises to 32 MB as big blocks are freed, in the heap, and a heap
top that is still in use pins everything below it: the process's RSS stays ~0.7 GB above what it
holds, and the engine's arrays come on top of that. `malloc_trim` returns the free pages (it
madvises them away wherever they are), so the peak is what the pass holds, not what it held.
Trimming is not free: pages handed back are faulted in again by the next allocations, so the
pass trims once, after the window build (the only place a cold pass frees a lot it will not
reuse).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache


@cache
def _trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS (a few ms; a no-op where libc cannot)."""
    trim = _trim()
    if trim is not None:
        trim(0)
