"""Robust statistics shared by the robust estimator (durations.py) and straggler naming, and
the median every part of the engine takes (`median`).

Both ask the same question of a worker: does it stand out from its peers by more than noise? The
reference is the peers' *lower* median (for two workers, the faster one, so a straggler cannot
pull the reference towards itself). Noise is judged two ways, and a worker stands out when it
passes either (`beyond_noise`):
- per step: its surplus exceeds a couple of robust sigmas of its step-by-step difference from the
  reference worker. This lets a rare spike pattern through (an evaluation every 20 steps leaves
  the median absolute deviation alone) while a heavy-tailed but healthy rank stays in.
- over the window: its surplus exceeds a few standard errors of the same difference averaged over
  contiguous blocks of steps. A loss that comes and goes on a large fraction of steps (a data
  loader whose prefetch runs dry every other step) inflates the per-step sigma up to the surplus
  itself, yet it is there in every stretch of the window; a burst (a neighbour stealing the
  rank's core for a while) is in some blocks only and stays noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal
NOISE_MARGIN = 2.0  # standing out means more than this many jitter sigmas
SPREAD_MARGIN = 3.0  # ... or more than this many standard errors of the block means
MIN_BLOCK_STEPS = 5  # steps per block of the window test
MIN_BLOCKS, MAX_BLOCKS = 4, 8  # fewer blocks than this: the per-step test alone


def lower_median_index(values: np.ndarray) -> int:
    """Index of the lower median of a 1-d array (ties: the first)."""
    return int(np.argsort(values, kind="stable")[(values.shape[0] - 1) // 2])


def median(values: np.ndarray, axis: int | None = None, keepdims: bool = False) -> Any:
    """np.median of a float32 / float64 ndarray with one selection per lane: the same value (NaN
    where a lane has one, whatever its payload; a zero's sign aside), dtype and type.

    np.median partitions at both middles and at the end (its NaN check): on the engine's lanes
    (up to 8,192 drawn deviations, twice per robust sigma) that was 2-9x the time of one partition
    at the upper middle with the lower middle the largest value below it, and a small job's
    analysis takes some thirty such medians. Anything else (other dtypes, float16 whose mean numpy
    takes in float32, subclasses, a tuple axis, a 0-d array with an axis, empty lanes) is
    np.median's."""
    a = values
    plain = type(a) is np.ndarray and a.dtype in (np.float32, np.float64) and a.size > 0
    if not plain or not (axis is None or (isinstance(axis, int) and a.ndim > 0)):
        return np.median(values, axis=axis, keepdims=keepdims)
    if axis is None:
        whole = median(a.ravel(), axis=0)
        return np.asarray(whole).reshape((1,) * a.ndim) if keepdims else whole
    n = a.shape[axis]
    k = n // 2
    part = np.partition(np.moveaxis(a, axis, -1), k, axis=-1)
    out = part[..., k]
    if n % 2 == 0:
        out = (part[..., :k].max(axis=-1) + out) / 2
    nan = np.isnan(part[..., k:]).any(axis=-1)  # partition puts NaN last, as sort does
    if nan.any():
        out = np.where(nan, np.nan, out).astype(a.dtype)
    return np.expand_dims(out, axis) if keepdims else out[()]  # a scalar, as np.median's


def robust_sigma(values: np.ndarray, axis: int = 0) -> np.ndarray:
    return MAD_TO_SIGMA * median(np.abs(values - median(values, axis=axis, keepdims=True)), axis=axis)


def jitter_against(per_step: np.ndarray, reference: int, workers: np.ndarray | None = None) -> np.ndarray:
    """Robust sigma over steps of each worker's difference from the reference worker, for
    `per_step` shaped [steps, workers]: of every worker, or of `workers` (indices) only. Callers
    ask only for the workers already past the other tests: medians over 4,096 workers × 500
    steps are seconds a pass need not spend."""
    block = per_step if workers is None else per_step[:, workers]
    return robust_sigma(block - per_step[:, reference][:, None], axis=0)


def beyond_noise(
    per_step: np.ndarray, reference: int, workers: np.ndarray, surplus: np.ndarray
) -> np.ndarray:
    """Whether each of `workers` (indices into the columns of `per_step`, [steps, workers]) stands
    out from the `reference` worker beyond noise, given its mean `surplus` per step over it: by
    the per-step test or the window test (module docstring)."""
    surplus = np.asarray(surplus, dtype=np.float64)
    out: np.ndarray = surplus > NOISE_MARGIN * jitter_against(per_step, reference, workers)
    steps = per_step.shape[0]
    blocks = min(MAX_BLOCKS, steps // MIN_BLOCK_STEPS)
    if blocks >= MIN_BLOCKS and not out.all():
        diff = per_step[:, workers] - per_step[:, reference][:, None]
        edges = np.linspace(0, steps, blocks + 1).astype(np.int64)
        means = np.add.reduceat(diff, edges[:-1], axis=0, dtype=np.float64) / np.diff(edges)[:, None]
        error = means.std(axis=0, ddof=1) / np.sqrt(blocks)
        out |= surplus > SPREAD_MARGIN * error
    return out
