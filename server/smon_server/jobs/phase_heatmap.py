"""A job's phase heatmap (rank × step seconds of one phase) for a window: from the grids the last
analysis pass stored (store/phase_grids.py) where it can, else from the raw step records."""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from smon_server.grid import Grid, concat_steps
from smon_server.store import phase_grids, queries
from smon_server.store.models import Job
from smon_server.store.queries import StepWindow
from smon_server.store.step_window import read_window
from smon_server.views import heatmap as heatmaps


def phase_heatmap(
    *,
    session: Session,
    job: Job,
    metric: str,
    window: StepWindow,
    default_last: int,
    from_rank: int | None = None,
    to_rank: int | None = None,
) -> Grid:
    """Rank × step grid of one phase's seconds (or `step_time`, `gc`, `other`), of the ranks in
    [from_rank, to_rank] with a record in the window.

    Steps the last analysis pass stored (store/phase_grids.py) are read from there; the default
    window is what it stored, as for the slowdown heatmap. Steps of an asked-for range outside
    it (older history, steps since the pass) come from the raw records, as they did before."""
    code = phase_grids.metric_code(session, job.key, metric)
    stored = phase_grids.stored_range(session, job.key)
    lo: int | None
    hi: int | None
    if window.is_default and stored is not None:
        lo, hi = stored
    else:
        lo, hi = queries.resolve_window(session=session, job=job, window=window, default_last=default_last)
        if lo is None and hi is None and window.is_default:
            return Grid.empty()
    if stored is None:
        return _raw_phase_grid(session, job, metric, lo, hi, from_rank, to_rank)
    low, high = -(2**63) if lo is None else lo, 2**63 - 1 if hi is None else hi
    parts = []
    if low < stored[0]:
        parts.append(_raw_phase_grid(session, job, metric, lo, min(high, stored[0] - 1), from_rank, to_rank))
    if low <= stored[1] and high >= stored[0]:
        parts.append(
            phase_grids.read(
                session,
                job.key,
                code,
                from_step=max(low, stored[0]),
                to_step=min(high, stored[1]),
                from_rank=from_rank,
                to_rank=to_rank,
            )
        )
    if high > stored[1]:
        parts.append(_raw_phase_grid(session, job, metric, max(low, stored[1] + 1), hi, from_rank, to_rank))
    return concat_steps(parts)


def _raw_phase_grid(
    session: Session,
    job: Job,
    metric: str,
    lo: int | None,
    hi: int | None,
    from_rank: int | None,
    to_rank: int | None,
) -> Grid:
    """The grid from the raw records of steps [lo, hi] (every rank read and decoded)."""
    records = read_window(session=session, job=job, from_step=lo, to_step=hi)
    ranks, rank_index = np.unique(records.rank, return_inverse=True)
    steps, step_index = np.unique(records.step, return_inverse=True)
    values = np.full((ranks.size, steps.size), np.nan, dtype=np.float32)
    values[rank_index, step_index] = (
        records.duration if metric == "step_time" else records.phase_seconds(metric)
    )
    grid = Grid(ranks.astype(np.int64), steps.astype(np.int64), values)
    return heatmaps.select(grid, from_rank=from_rank, to_rank=to_rank, from_step=None, to_step=None)
