"""A per-step series' stored form (the value type, `StepSeries`, is smon_server/series.py).

As JSON rows a 500-step series was 78 kB, encoded and TOAST-compressed on every pass of every
job; as little-endian columns it is 32 bytes a step, written as they are and read without
parsing. Values stay float64: the API serves the numbers the analysis computed.
"""

from __future__ import annotations

import numpy as np

from smon_server.series import StepSeries

_MAGIC = b"SMS1"


def pack(series: StepSeries) -> bytes:
    n = len(series)
    return b"".join(
        (
            _MAGIC,
            np.array([n], dtype="<i8").tobytes(),
            np.asarray(series.steps, dtype="<i8").tobytes(),
            *(np.asarray(c, dtype="<f8").tobytes() for c in series.values()),
        )
    )


def unpack(blob: bytes | None) -> StepSeries:
    if not blob:
        return StepSeries.empty()
    if blob[:4] != _MAGIC:
        raise ValueError("not a stored step series")
    n = int(np.frombuffer(blob, dtype="<i8", count=1, offset=4)[0])
    if len(blob) != 12 + 32 * n:
        raise ValueError(f"a stored step series of {n} steps is {len(blob)} bytes, not {12 + 32 * n}")
    steps = np.frombuffer(blob, dtype="<i8", count=n, offset=12)
    values = [np.frombuffer(blob, dtype="<f8", count=n, offset=12 + 8 * n * (k + 1)) for k in range(3)]
    return StepSeries(steps, *values)
