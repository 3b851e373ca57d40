"""The heatmap response built one Python value at a time: the reference the server's array-built
body (views/heatmap.py `response_json`) is checked against, and the "before" of
benchmarks/api_latency.py. The server itself never builds it."""

from __future__ import annotations

import math
from typing import Any

from smon_server.grid import Grid
from smon_server.views.heatmap import _binned, _ranges


def downsample(grid: Grid, *, max_ranks: int, max_steps: int) -> dict[str, Any]:
    """The grid binned to fit, as the heatmap response's fields (null where a bin has no value)."""
    values, r_edges, s_edges, downsampled = _binned(grid, max_ranks, max_steps)
    cells: list[list[float | None]] = [
        [None if math.isnan(v) else round(v, 6) for v in row] for row in values.tolist()
    ]
    return {
        "ranks": [int(grid.ranks[i]) for i in r_edges],
        "steps": [int(grid.steps[j]) for j in s_edges],
        "values": cells,
        "downsampled": downsampled,
        "rank_ranges": _ranges(grid.ranks, r_edges) if downsampled else None,
        "step_ranges": _ranges(grid.steps, s_edges) if downsampled else None,
    }
