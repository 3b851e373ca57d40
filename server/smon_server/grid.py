"""A rank × step grid of floats (a heatmap): the value the analysis builds, the store packs
(store/grids.py) and the views bin for a screen (views/heatmap.py).

It sits beside `columns.py`, under all three, because the views may not import the store and the
store may not import the views (pyproject.toml's import contracts); it needs numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
