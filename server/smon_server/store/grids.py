"""A rank × step grid of floats (a heatmap) and its compact stored form.

A 4,096-rank × 500-step heatmap is two million numbers: as JSON lists it was 17 MB of the stored
result and seconds to decode. Stored as float32 bytes it is 8 MB, read without parsing, and the
API downsamples it for the screen (views/heatmap.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_MAGIC = b"SMG1"


@dataclass(frozen=True)
class Grid:
    ranks: np.ndarray  # [n] int64
    steps: np.ndarray  # [m] int64
    values: np.ndarray  # [n, m] float32, NaN where there is no value

    @classmethod
    def empty(cls) -> Grid:
        return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, 0), np.float32))


def concat_steps(parts: list[Grid]) -> Grid:
    """Grids of consecutive step ranges side by side, over the union of their ranks."""
    parts = [g for g in parts if g.steps.size or g.ranks.size]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return Grid.empty()
    ranks = np.unique(np.concatenate([g.ranks for g in parts])).astype(np.int64)
    steps = np.concatenate([g.steps for g in parts]).astype(np.int64)
    values = np.full((ranks.size, steps.size), np.nan, dtype=np.float32)
    at = 0
    for g in parts:
        values[np.searchsorted(ranks, g.ranks), at : at + g.steps.size] = g.values
        at += g.steps.size
    return Grid(ranks, steps, values)


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
