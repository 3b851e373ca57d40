"""Heatmaps are stored as float32 bytes and served binned for a screen (store/grids, views/heatmap)."""

from __future__ import annotations

import numpy as np
import pytest

from smon_server.grid import Grid
from smon_server.store.grids import pack, unpack
from smon_server.views.heatmap import select
from tests.support.heatmaps import downsample


def grid(n: int, m: int, hot: tuple[int, int] | None = None) -> Grid:
    rng = np.random.default_rng(1)
    values = (1.0 + 0.01 * rng.random((n, m))).astype(np.float32)
    values[0, 0] = np.nan
    if hot:
        values[hot] = 3.0
    return Grid(np.arange(n, dtype=np.int64) * 2, np.arange(m, dtype=np.int64) + 100, values)


def test_pack_round_trip_keeps_every_value_and_gap() -> None:
    g = grid(37, 11)
    back = unpack(pack(g))
    assert back.ranks.tolist() == g.ranks.tolist() and back.steps.tolist() == g.steps.tolist()
    np.testing.assert_array_equal(back.values, g.values)  # NaN in the same places
    assert unpack(pack(Grid.empty())).values.shape == (0, 0)
    assert unpack(None).values.shape == (0, 0)
    with pytest.raises(ValueError, match="not a stored grid"):
        unpack(b"[1, 2, 3]")


def test_a_hot_rank_survives_binning() -> None:
    g = grid(4096, 500, hot=(1234, 321))
    out = downsample(g, max_ranks=256, max_steps=100)
    assert out["downsampled"] and len(out["values"]) == 256 and len(out["values"][0]) == 100
    row = next(i for i, (a, b) in enumerate(out["rank_ranges"]) if a <= 2 * 1234 <= b)
    col = next(j for j, (a, b) in enumerate(out["step_ranges"]) if a <= 100 + 321 <= b)
    assert out["values"][row][col] == pytest.approx(3.0)
    flat = [v for r in out["values"] for v in r if v is not None]
    assert max(flat) == pytest.approx(3.0) and sorted(flat)[-2] < 1.02  # only that cell is hot
    # Bins tile the axes: every rank and step in exactly one bin, in order.
    ranks = [r for a, b in out["rank_ranges"] for r in range(a, b + 1, 2)]
    assert ranks == g.ranks.tolist()
    assert out["ranks"] == [a for a, _ in out["rank_ranges"]]


def test_small_grids_and_zoom_are_full_detail() -> None:
    g = grid(8, 6, hot=(3, 2))
    out = downsample(g, max_ranks=512, max_steps=512)
    assert not out["downsampled"] and out["rank_ranges"] is None
    assert out["values"][0][0] is None  # a gap stays a gap
    assert out["values"][3][2] == pytest.approx(3.0)
    zoom = select(g, from_rank=4, to_rank=8, from_step=101, to_step=103)
    assert zoom.ranks.tolist() == [4, 6, 8] and zoom.steps.tolist() == [101, 102, 103]
    assert zoom.values[1, 1] == pytest.approx(3.0)  # rank 6, step 102
