"""Heatmaps as a screen shows them: at most `max_ranks` × `max_steps` cells, zoomable by range.

A screen has a few hundred pixels per axis, so a 4,096-rank grid is binned: each cell holds the
*maximum* of its bin, so one hot rank among 32 still lights its row (on-call looks for the worst,
and a mean would dilute it 32-fold). `rank_ranges` / `step_ranges` say which ranks and steps each
row and column covers; asking for a narrower `from_rank..to_rank` / step range gives full detail.
"""

from __future__ import annotations

import base64
import json
import math
import warnings

import numpy as np

from smon_server.grid import Grid


def select(
    grid: Grid, *, from_rank: int | None, to_rank: int | None, from_step: int | None, to_step: int | None
) -> Grid:
    rows = np.ones(grid.ranks.shape, dtype=bool)
    cols = np.ones(grid.steps.shape, dtype=bool)
    if from_rank is not None:
        rows &= grid.ranks >= from_rank
    if to_rank is not None:
        rows &= grid.ranks <= to_rank
    if from_step is not None:
        cols &= grid.steps >= from_step
    if to_step is not None:
        cols &= grid.steps <= to_step
    return Grid(grid.ranks[rows], grid.steps[cols], grid.values[np.ix_(rows, cols)])


def _edges(n: int, limit: int) -> np.ndarray:
    bins = min(n, max(1, limit))
    size = math.ceil(n / bins) if n else 1
    return np.arange(0, n, size) if n else np.empty(0, dtype=np.int64)


def _binned(grid: Grid, max_ranks: int, max_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(cell values, first row of each rank bin, first column of each step bin, binned at all)."""
    n, m = grid.values.shape
    r_edges, s_edges = _edges(n, max_ranks), _edges(m, max_steps)
    values = grid.values.astype(np.float32, copy=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN bin is a null cell
        if r_edges.size < n:
            values = np.fmax.reduceat(values, r_edges, axis=0)
        if s_edges.size < m:
            values = np.fmax.reduceat(values, s_edges, axis=1)
    return values, r_edges, s_edges, bool(r_edges.size < n or s_edges.size < m)


def response_json(
    grid: Grid,
    *,
    job_id: str,
    metric: str,
    max_ranks: int,
    max_steps: int,
    encoding: str = "json",
    attempt: int = 1,
    attempts: int = 1,
) -> bytes:
    """The heatmap response (api.schemas.HeatmapOut) as JSON bytes, built with array operations:
    building and validating 256,000 cells one Python object at a time took most of a 4,096-rank
    heatmap's answer (that reference lives on in tests/support/heatmaps.py). The cells are its to the
    digit: for a float32 v, v × 10⁶ is exact in float64, so rint(v × 10⁶) / 10⁶ is the correctly
    rounded value Python's round(v, 6) gives."""
    values, r_edges, s_edges, downsampled = _binned(grid, max_ranks, max_steps)
    head = {
        "job_id": job_id,
        "attempt": attempt,
        "attempts": attempts,
        "metric": metric,
        "ranks": grid.ranks[r_edges].tolist(),
        "steps": grid.steps[s_edges].tolist(),
        "downsampled": downsampled,
        "rank_ranges": _ranges(grid.ranks, r_edges) if downsampled else None,
        "step_ranges": _ranges(grid.steps, s_edges) if downsampled else None,
        "values_f32": None,
    }
    if encoding == "f32":
        # The cells as float32 bytes (row-major, little-endian, NaN for none), base64: a
        # 512 × 500 grid is 1.4 MB of text instead of ~5 MB of decimals, no number is formatted
        # on the server or parsed in the browser (a Float32Array views the bytes).
        cells32 = np.ascontiguousarray(values, dtype="<f4")
        cells32[~np.isfinite(cells32)] = np.nan
        head.update(values=[], values_f32=base64.b64encode(cells32.tobytes()).decode("ascii"))
        return json.dumps(head).encode()
    rounded = np.rint(values.astype(np.float64) * 1e6) / 1e6
    rounded[~np.isfinite(rounded)] = np.nan  # null, as pydantic writes infinities
    # NaN cells print as NaN, the only non-number token json.dumps writes here: null instead.
    cells = json.dumps(rounded.tolist(), allow_nan=True).replace("NaN", "null")
    text = json.dumps(head)
    return (text[:-1] + ', "values": ' + cells + "}").encode()


def _ranges(ids: np.ndarray, edges: np.ndarray) -> list[list[int]]:
    if edges.size == 0:  # no rank (or step) in the range asked for
        return []
    ends = np.append(edges[1:], ids.shape[0]) - 1
    return [[int(ids[a]), int(ids[b])] for a, b in zip(edges, ends, strict=True)]
