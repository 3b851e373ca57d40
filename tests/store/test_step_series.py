"""A per-step series is stored as packed columns and served as the same JSON rows (store/step_series)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smon_server.series import StepSeries
from smon_server.store.step_series import pack, unpack


def series(n: int) -> StepSeries:
    rng = np.random.default_rng(3)
    measured = 1.0 + rng.random(n)
    ideal = np.full(n, 0.9)
    slowdown = measured / ideal
    if n > 2:
        slowdown[1] = math.inf  # not finite: served as null
        measured[2] = math.nan
    return StepSeries.of(np.arange(n) + 40, measured, ideal, slowdown)


@pytest.mark.parametrize("n", [0, 1, 3, 500])
def test_round_trip_keeps_every_value_to_the_bit(n: int) -> None:
    s = series(n)
    back = unpack(pack(s))
    assert back == s and back.rows() == s.rows()
    assert len(pack(s)) == 12 + 32 * n  # header, int64 steps, three float64 columns


def test_rows_are_the_json_the_api_served() -> None:
    rows = series(3).rows()
    assert [r["step"] for r in rows] == [40, 41, 42]
    assert rows[1]["slowdown"] is None and rows[2]["step_time"] is None
    assert all(isinstance(r["ideal_time"], float) for r in rows) and rows[0]["ideal_time"] == 0.9
    assert set(rows[0]) == {"step", "step_time", "ideal_time", "slowdown"}


def test_equality_sees_a_changed_value_and_equal_gaps() -> None:
    a, b = series(5), series(5)
    assert a == b  # NaN in the same places
    b.ideal_time[4] += 1e-12
    assert a != b
    assert StepSeries.empty() == unpack(None) == unpack(b"")


def test_a_blob_that_is_not_a_series_is_refused() -> None:
    with pytest.raises(ValueError, match="not a stored step series"):
        unpack(b'[{"step": 1}]')
    with pytest.raises(ValueError, match="not 44"):
        unpack(pack(series(1))[:-1])
