"""The jitter allowance's sigma from a sample of a large block (durations._deviations)."""

from __future__ import annotations

import numpy as np

from smon_server.whatif import durations
from smon_server.whatif.robust import robust_sigma


def _block(slots: int, steps: int, dp: int, present: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    measured = 0.05 + 0.004 * rng.standard_normal((slots, steps, dp))
    measured[:, :, 3] += 0.02  # a slow worker: its own mean takes its bias out
    measured[rng.random(measured.shape) >= present] = 0.0
    ran = measured > 0
    count = ran.sum(axis=1)
    mean = np.divide(measured.sum(axis=1), count, out=np.zeros(count.shape), where=count > 0)
    return measured, mean


def _every(measured: np.ndarray, mean: np.ndarray, slots: np.ndarray, cols: np.ndarray) -> np.ndarray:
    block = np.ix_(slots, np.arange(measured.shape[1]), cols)
    return (measured[block] - mean[slots][:, None, cols])[measured[block] > 0]


def test_a_small_block_is_used_whole() -> None:
    measured, mean = _block(2, 50, 16, present=1.0)
    slots, cols = np.array([0, 1]), np.arange(16)
    got = durations._deviations(measured, mean, measured > 0, slots, cols)
    assert np.array_equal(got, _every(measured, mean, slots, cols))


def test_a_large_block_gives_the_same_sigma_from_a_sample() -> None:
    measured, mean = _block(3, 500, 64, present=1.0)
    slots, cols = np.array([0, 2]), np.flatnonzero(np.arange(64) != 7)
    got = durations._deviations(measured, mean, measured > 0, slots, cols)
    every = _every(measured, mean, slots, cols)
    assert got.size <= durations.SIGMA_SAMPLE < every.size
    # Drawn from the block's own instances: each sampled deviation is one of them.
    assert np.isin(got, every).all()
    assert abs(float(robust_sigma(got)) / float(robust_sigma(every)) - 1) < 0.05
    again = durations._deviations(measured, mean, measured > 0, slots, cols)
    assert np.array_equal(got, again)  # the same window gives the same sigma


def test_an_op_type_on_few_steps_is_sampled_from_the_instances_that_ran() -> None:
    measured, mean = _block(1, 2000, 64, present=0.05)  # a GC pause on one instance in twenty
    slots, cols = np.array([0]), np.arange(64)
    got = durations._deviations(measured, mean, measured > 0, slots, cols)
    every = _every(measured, mean, slots, cols)
    assert got.size == min(durations.SIGMA_SAMPLE, every.size)
    assert np.isin(got, every).all()
    assert abs(float(robust_sigma(got)) / float(robust_sigma(every)) - 1) < 0.05
