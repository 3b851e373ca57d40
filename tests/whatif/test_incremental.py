"""A window laid out from the last analysis's kept steps and its new ones (whatif/incremental.py)
gives the analysis a full build of the same window gives, to the bit, pass after pass; and a
window that is not the old one slid on is built whole."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.engine import Reusable, WhatIfResult, analyze
from smon_server.whatif.ops import OpTable
from tests.support.synthetic import SyntheticJob, synthetic_table

JOBS = {
    "dp-gc": SyntheticJob(dp=6, steps=40, gc_probability=0.3, gc_seconds=0.003, slow_workers={(2, 0): 1.4}),
    "pipeline": SyntheticJob(
        dp=3, pp=2, microbatches=4, steps=40, slow_workers={(1, 1): 1.5}, launch_gap=0.0005
    ),
    "healthy": SyntheticJob(dp=4, steps=40, seed=3),
}


def _kept(table: OpTable, config: WhatIfConfig) -> Reusable:
    prepared = analyze(table, config=config, keep=True).prepared
    assert prepared is not None and prepared.kept is not None
    return prepared.kept


def _window(table: OpTable, first: int, last: int) -> OpTable:
    return table.take((table.step >= first) & (table.step <= last))


def _same(a: object, b: object, name: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.shape == b.shape, name
        assert np.array_equal(a, b, equal_nan=True), name
    elif isinstance(a, float):
        assert isinstance(b, float) and (a == b or (np.isnan(a) and np.isnan(b))), name
    elif isinstance(a, tuple | list) and a and isinstance(a[0], np.ndarray):
        assert len(a) == len(b)  # type: ignore[arg-type]
        for x, y in zip(a, b, strict=True):  # type: ignore[call-overload]
            _same(x, y, name)
    else:
        assert a == b, name


def _assert_same_result(slid: WhatIfResult, full: WhatIfResult) -> None:
    for f in fields(WhatIfResult):
        if f.name in ("prepared", "attribution", "config", "clock_offsets"):
            continue
        _same(getattr(slid, f.name), getattr(full, f.name), f.name)
    assert (slid.attribution is None) == (full.attribution is None)
    if full.attribution is not None:
        for f in fields(full.attribution):
            _same(
                getattr(slid.attribution, f.name), getattr(full.attribution, f.name), f"attribution.{f.name}"
            )
    p, q = slid.prepared, full.prepared
    assert p is not None and q is not None
    _same(p.durations.measured, q.durations.measured, "measured")
    _same(p.layout.main_order, q.layout.main_order, "main_order")
    _same(p.layout.step_origin, q.layout.step_origin, "step_origin")
    assert p.durations.left_out == q.durations.left_out


@pytest.mark.parametrize("name", sorted(JOBS))
@pytest.mark.parametrize("estimator", ["robust", "paper"])
@pytest.mark.parametrize("precision", ["double", "single"])
def test_a_slid_window_gives_the_full_analysis(name: str, estimator: str, precision: str) -> None:
    table = synthetic_table(JOBS[name])
    config = WhatIfConfig(estimator=estimator, precision=precision, force_attribution=True)  # type: ignore[arg-type]
    width, slid_passes = 20, 0
    kept = _kept(_window(table, 0, width - 1), config)
    for first in (1, 4, 4, 9, 19):  # slid by 1, 3, none (the same window again), 5, 10 steps
        window = _window(table, first, first + width - 1)
        got = analyze(window, config=config, reuse=kept, keep=True)
        assert got.prepared is not None
        slid_passes += got.prepared.slid
        _assert_same_result(got, analyze(window, config=config))
        assert got.prepared.kept is not None
        kept = got.prepared.kept
    assert slid_passes == 5


def test_a_slot_that_slides_out_gets_a_full_build() -> None:
    """A checkpoint every 15 steps: when the window no longer holds one, a full build has no
    checkpoint slot, so the slid window cannot be used; the next window slides again."""
    table = synthetic_table(SyntheticJob(dp=4, steps=40, checkpoint_every=15, checkpoint_seconds=0.02))
    config = WhatIfConfig(estimator="robust")
    kept = _kept(_window(table, 10, 19), config)
    slid = []
    for first in (12, 15, 16):  # step 14 (the checkpoint) leaves the window at 15
        window = _window(table, first, first + 9)
        got = analyze(window, config=config, reuse=kept, keep=True)
        assert got.prepared is not None
        slid.append(got.prepared.slid)
        _assert_same_result(got, analyze(window, config=config))
        assert got.prepared.kept is not None
        kept = got.prepared.kept
    assert slid == [True, False, True]


def test_a_new_worker_or_a_gap_gets_a_full_build() -> None:
    table = synthetic_table(SyntheticJob(dp=4, steps=30))
    config = WhatIfConfig(estimator="robust")
    kept = _kept(table.take((table.step < 20) & (table.dp_rank < 3)), config)
    window = table.take((table.step >= 2) & (table.step < 25))  # rank 3 joins
    got = analyze(window, config=config, reuse=kept)
    assert got.prepared is not None and not got.prepared.slid
    _assert_same_result(got, analyze(window, config=config))
    kept = _kept(table.take(table.step < 20), config)
    window = table.take((table.step < 25) & (table.step != 7))  # not the kept steps
    got = analyze(window, config=config, reuse=kept)
    assert got.prepared is not None and not got.prepared.slid
    _assert_same_result(got, analyze(window, config=config))


@pytest.mark.parametrize("name", sorted(JOBS))
@pytest.mark.parametrize("estimator", ["robust", "paper"])
@pytest.mark.parametrize("precision", ["double", "single"])
def test_the_recent_stretch_cut_from_the_window_gives_its_own_analysis(
    name: str, estimator: str, precision: str
) -> None:
    """The newest steps of a window analysed on their own (the live recent stretch), laid out by
    cutting the window's layout (incremental.cut), give what a build of their rows gives."""
    table = synthetic_table(JOBS[name])
    config = WhatIfConfig(estimator=estimator, precision=precision, force_attribution=True)  # type: ignore[arg-type]
    window = _window(table, 5, 34)
    kept = _kept(window, config)
    for first in (25, 30, 5):  # ten steps, five, the whole window
        recent = window.take(window.step >= first)
        got = analyze(recent, config=config, within=kept)
        assert got.prepared is not None and got.prepared.slid
        _assert_same_result(got, analyze(recent, config=config))


def test_a_recent_stretch_the_window_does_not_lay_out_alike_is_built() -> None:
    """A slot that ran only in the window's older steps (a checkpoint), a worker silent in the
    newest steps, or rows the window did not lay out: a build of the stretch differs from a cut
    of the window, so it is built."""
    config = WhatIfConfig(estimator="robust")
    table = synthetic_table(SyntheticJob(dp=4, steps=40, checkpoint_every=15, checkpoint_seconds=0.02))
    window = _window(table, 10, 25)  # the checkpoint of step 14
    recent = window.take(window.step >= 18)
    got = analyze(recent, config=config, within=_kept(window, config))
    assert got.prepared is not None and not got.prepared.slid
    _assert_same_result(got, analyze(recent, config=config))

    table = synthetic_table(SyntheticJob(dp=4, steps=30))
    window = table.take(~((table.step >= 20) & (table.dp_rank == 3)))  # rank 3 silent from step 20
    recent = window.take(window.step >= 22)
    got = analyze(recent, config=config, within=_kept(window, config))
    assert got.prepared is not None and not got.prepared.slid
    _assert_same_result(got, analyze(recent, config=config))

    window = _window(table, 0, 19)
    recent = _window(table, 15, 24)  # steps the window never had
    got = analyze(recent, config=config, within=_kept(window, config))
    assert got.prepared is not None and not got.prepared.slid
    _assert_same_result(got, analyze(recent, config=config))
