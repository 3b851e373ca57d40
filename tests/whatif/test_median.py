"""robust.median is np.median's value, dtype and type: the engine's ideals, sigmas and diagnoses
use it in place of np.median, so any difference would move S, a straggler's naming or its
evidence. float32 / float64 go through its own selection; everything else must come out of
np.median unchanged (float16, whose mean numpy takes in float32, ints, masked arrays)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from smon_server.whatif.robust import median, robust_sigma


def _same(want: Any, got: Any) -> bool:
    return (
        type(want) is type(got)
        and np.shape(want) == np.shape(got)
        and np.asarray(want).dtype == np.asarray(got).dtype
        and np.array_equal(np.asarray(want), np.asarray(got), equal_nan=True)
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64])
def test_equals_numpy_on_random_arrays(dtype: type) -> None:
    """Every shape up to three axes, odd and even lanes, each axis and none, keepdims or not,
    with NaN (one, or every value) and infinities mixed in."""
    rng = np.random.default_rng(7)
    for trial in range(600):
        shape = tuple(int(x) for x in rng.integers(1, 9, int(rng.integers(0, 4))))
        a = (rng.standard_normal(shape) * 10).round(int(rng.integers(0, 3)))  # ties too
        if a.size and trial % 5 == 0:
            a.flat[rng.integers(0, a.size)] = np.nan
        if a.size and trial % 7 == 0:
            a.flat[:] = np.nan
        if a.size and trial % 11 == 0:
            a.flat[rng.integers(0, a.size)] = np.inf
        if a.size and trial % 13 == 0:
            a.flat[rng.integers(0, a.size)] = -np.inf
        a = np.nan_to_num(a, posinf=1e6, neginf=-1e6).astype(dtype) if dtype is np.int64 else a.astype(dtype)
        for axis in [None, *range(-a.ndim, a.ndim)]:
            for keepdims in (False, True):
                with warnings.catch_warnings(), np.errstate(all="ignore"):
                    warnings.simplefilter("ignore")
                    want = np.median(a, axis=axis, keepdims=keepdims)
                    got = median(a, axis=axis, keepdims=keepdims)
                assert _same(want, got), (shape, dtype, axis, keepdims, want, got)


def test_large_lanes_and_robust_sigma() -> None:
    """The sizes a pass meets (a drawn sample of 8,192 deviations, 64 workers, [500 steps, 64])."""
    rng = np.random.default_rng(3)
    for n in (8191, 8192, 64, 63):
        for dtype in (np.float64, np.float32):
            x: Any = rng.standard_normal(n).astype(dtype)
            assert _same(np.median(x), median(x))
            mad = 1.4826 * np.median(np.abs(x - np.median(x, axis=0, keepdims=True)), axis=0)
            assert _same(mad, robust_sigma(x))
    grid = rng.standard_normal((500, 64))
    for axis in (0, 1):
        assert _same(np.median(grid, axis=axis), median(grid, axis=axis))
        assert _same(np.median(grid, axis=axis, keepdims=True), median(grid, axis=axis, keepdims=True))


def test_numpy_answers_what_it_does_not_select() -> None:
    """float16 near its top (numpy's mean of the middles is taken in float32: no overflow),
    a masked array's mask, a tuple axis."""
    top = np.array([60000, 60000], dtype=np.float16)
    assert _same(np.median(top), median(top)) and np.isfinite(median(top))
    masked = np.ma.masked_array([1.0, 2.0, 100.0, 3.0], mask=[False, False, True, False])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's own about partition and masks
        want, got = np.median(masked), median(masked)
    assert float(want) == float(got) and type(want) is type(got)
    grid = np.arange(24.0).reshape(2, 3, 4)
    assert _same(np.median(grid, axis=(0, 2)), median(grid, axis=(0, 2)))  # type: ignore[arg-type]


def test_empty_is_numpys() -> None:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        assert _same(np.median(np.zeros(0)), median(np.zeros(0)))
        assert _same(np.median(np.zeros((0, 3)), axis=0), median(np.zeros((0, 3)), axis=0))
