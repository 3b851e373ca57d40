"""Robust statistics shared by the robust estimator (durations.py) and straggler naming.

Both ask the same question of a worker: does it stand out from its peers by more than noise? The
reference is the peers' *lower* median (for two workers, the faster one, so a straggler cannot
pull the reference towards itself), and noise is the robust sigma of the worker's step-by-step
difference from that reference worker.
"""

from __future__ import annotations

import numpy as np

MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal
NOISE_MARGIN = 2.0  # standing out means more than this many jitter sigmas


def lower_median_index(values: np.ndarray) -> int:
    """Index of the lower median of a 1-d array (ties: the first)."""
    return int(np.argsort(values, kind="stable")[(values.shape[0] - 1) // 2])


def robust_sigma(values: np.ndarray, axis: int = 0) -> np.ndarray:
    return MAD_TO_SIGMA * np.median(np.abs(values - np.median(values, axis=axis, keepdims=True)), axis=axis)


def jitter_against(per_step: np.ndarray, reference: int, workers: np.ndarray | None = None) -> np.ndarray:
    """Robust sigma over steps of each worker's difference from the reference worker, for
    `per_step` shaped [steps, workers]: of every worker, or of `workers` (indices) only. Callers
    ask only for the workers already past the other tests: medians over 4,096 workers × 500
    steps are seconds a pass need not spend."""
    block = per_step if workers is None else per_step[:, workers]
    return robust_sigma(block - per_step[:, reference][:, None], axis=0)
