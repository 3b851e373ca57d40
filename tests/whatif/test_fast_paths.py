"""Shortcuts of the cold pass give what the code they replace gave, to the bit: the union of a
record's spans without the sort when spans come sorted, and complete steps found with a dense
(step, worker) grid instead of sorting the pairs."""

from __future__ import annotations

import numpy as np
import pytest

from smon_server import columns as columns_module
from smon_server.columns import StepColumns
from smon_server.whatif.inputs import from_steps
from smon_server.whatif.inputs.from_steps import complete_steps
from tests.whatif.step_records import StepRow


def _records(seed: int, *, ranks: int = 6, steps: int = 8, shuffle: bool = False) -> StepColumns:
    """Random records: nested and overlapping spans, some past the step's end or before its start,
    ties of start; with `shuffle` each record's spans out of start order."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        for rank in range(ranks):
            if rng.random() < 0.1:
                continue  # a missing record: that step is incomplete
            spans: list[tuple[str, float, float, int, int]] = []
            for _ in range(int(rng.integers(0, 7))):
                start = float(rng.choice([rng.uniform(-0.05, 1.1), 0.25]))
                kind = "forward" if rng.random() < 0.5 else "gc"
                spans.append((kind, start, float(rng.uniform(0, 0.4)), -1, 0))
            spans.sort(key=lambda s: (s[1], -s[2]))
            if shuffle:
                rng.shuffle(spans)
            rows.append(
                StepRow(rank=rank, step=step, dp_rank=rank, pp_rank=0, tp_rank=0, start_time=100.0 + step,
                        duration=float(rng.uniform(0.5, 1.0)), phases={}, spans=spans)
            )  # fmt: skip
    return StepColumns.from_rows(rows)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("shuffle", [False, True])
def test_covered_seconds_without_the_sort_is_the_sorted_answer(
    seed: int, shuffle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _records(seed, shuffle=shuffle)
    fast = records.covered_seconds()
    monkeypatch.setattr(columns_module, "_sorted_within", lambda values, segment: False)
    assert np.array_equal(fast.view(np.int64), records.covered_seconds().view(np.int64))


def test_spans_out_of_order_are_not_taken_for_sorted() -> None:
    assert not columns_module._sorted_within(np.array([0.0, 0.5, 0.2]), np.array([0, 0, 0]))
    assert columns_module._sorted_within(np.array([0.0, 0.5, 0.2]), np.array([0, 0, 1]))
    assert columns_module._sorted_within(np.array([0.3, 0.3]), np.array([2, 2]))


def _complete_steps_by_sorting(cols: StepColumns, workers: int | None = None) -> StepColumns:
    """complete_steps as it was before the dense grid (the reference)."""
    worker = from_steps._worker_ids(cols)
    workers = workers or int(worker.max()) + 1
    steps, step_index = np.unique(cols.step, return_inverse=True)
    pairs = np.unique(step_index.astype(np.int64) * workers + worker)
    per_step = np.bincount(pairs // workers, minlength=steps.size)
    return cols.take(per_step[step_index] == workers)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("steps", [1, 8, 300])
def test_complete_steps_on_a_dense_grid_match_sorting_the_pairs(seed: int, steps: int) -> None:
    records = _records(seed, ranks=5, steps=steps)
    for workers in (None, 5, 6):
        got = complete_steps(records, workers)
        want = _complete_steps_by_sorting(records, workers)
        assert np.array_equal(got.rank, want.rank) and np.array_equal(got.step, want.step)
        assert np.array_equal(got.span_start, want.span_start)


def test_complete_steps_far_apart_take_the_sorting_path() -> None:
    records = _records(3, ranks=4, steps=3)
    far = StepColumns.concat([records, records.take(records.step == 2)])
    far = far.take(np.arange(len(far)))
    object.__setattr__(far, "step", np.where(np.arange(len(far)) >= len(records), 10**9, far.step))
    got, want = complete_steps(far, 4), _complete_steps_by_sorting(far, 4)
    assert np.array_equal(got.step, want.step) and np.array_equal(got.rank, want.rank)


def test_since_is_a_view_of_step_ordered_rows_and_a_copy_otherwise() -> None:
    """OpTable.since gives the rows of the mask `step >= s`, as views when the rows are in step
    order (the live window's), by a gather when they are not."""
    from tests.whatif.builders import data_parallel_step, table

    ops = [
        op
        for step in range(6)
        for op in data_parallel_step(step, [0.1, 0.3], backward=0.2, transfer=0.1, optimizer=0.1, origin=step)
    ]
    ordered = table(ops)
    for first in (-1, 0, 3, 5, 9):
        want = ordered.take(ordered.step >= first)
        got = ordered.since(first)
        for name in ("step", "dp_rank", "op_type", "start", "duration", "rank", "seq_sq"):
            assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=True)
        assert len(got) == 0 or np.shares_memory(got.duration, ordered.duration)
    shuffled = ordered.take(np.random.default_rng(0).permutation(len(ordered)))
    got = shuffled.since(3)
    assert sorted(got.step.tolist()) == sorted(ordered.step[ordered.step >= 3].tolist())
    assert np.array_equal(got.step, shuffled.step[shuffled.step >= 3])
    assert not np.shares_memory(got.duration, shuffled.duration)
