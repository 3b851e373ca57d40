"""A heatmap's compact stored form (the value type, `Grid`, is smon_server/grid.py).

A 4,096-rank × 500-step heatmap is two million numbers: as JSON lists it was 17 MB of the stored
result and seconds to decode. Stored as float32 bytes it is 8 MB, read without parsing, and the
API downsamples it for the screen (views/heatmap.py).
"""

from __future__ import annotations

import numpy as np

# Importable from here too until their users outside views (jobs/, api/jobs.py, benchmarks) import them
# from smon_server.grid (left for the branches that change those files at the same time).
from smon_server.grid import Grid

_MAGIC = b"SMG1"


def pack(grid: Grid) -> bytes:
    n, m = grid.values.shape
    header = np.array([n, m], dtype="<i8").tobytes()
    return b"".join(
        (
            _MAGIC,
            header,
            np.asarray(grid.ranks, dtype="<i8").tobytes(),
            np.asarray(grid.steps, dtype="<i8").tobytes(),
            np.asarray(grid.values, dtype="<f4").tobytes(),
        )
    )


def unpack(blob: bytes | None) -> Grid:
    if not blob:
        return Grid.empty()
    if blob[:4] != _MAGIC:
        raise ValueError("not a stored grid")
    n, m = (int(x) for x in np.frombuffer(blob, dtype="<i8", count=2, offset=4))
    offset = 4 + 16
    ranks = np.frombuffer(blob, dtype="<i8", count=n, offset=offset)
    offset += 8 * n
    steps = np.frombuffer(blob, dtype="<i8", count=m, offset=offset)
    offset += 8 * m
    values = np.frombuffer(blob, dtype="<f4", count=n * m, offset=offset).reshape(n, m)
    return Grid(ranks, steps, values)
