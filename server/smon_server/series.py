"""A job's per-step series (`GET /jobs/{id}/steps`): the value the analysis builds, the store
packs (store/step_series.py) and the API serves as JSON rows.

Columns, not a list of dicts: a pass builds one for every job, and as 500 dicts it cost the
worker a dict per step, the pickling to the server process, and ~1 ms of JSON encoding there
(78 kB a job, rewritten every pass). It sits beside `grid.py` for the same reason: the views
build it and the store packs it, and neither may import the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, eq=False)
class StepSeries:
    steps: np.ndarray  # [n] int64
    step_time: np.ndarray  # [n] float64: replayed with measured durations, T_s(D)
    ideal_time: np.ndarray  # [n] float64: the step's ideal
    slowdown: np.ndarray  # [n] float64: S_s; NaN where not finite (served as null)

    @classmethod
    def empty(cls) -> StepSeries:
        nothing = np.empty(0, np.float64)
        return cls(np.empty(0, np.int64), nothing, nothing, nothing)

    @classmethod
    def of(cls, steps: Any, step_time: Any, ideal_time: Any, slowdown: Any) -> StepSeries:
        """Columns as the series keeps them (int64 steps, float64 values, every value not finite
        as NaN: JSON has no infinity)."""

        def floats(values: Any) -> np.ndarray:
            column = np.array(values, dtype=np.float64)
            column[~np.isfinite(column)] = np.nan
            return column

        return cls(np.asarray(steps, dtype=np.int64), floats(step_time), floats(ideal_time), floats(slowdown))

    def __len__(self) -> int:
        return int(self.steps.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepSeries):
            return NotImplemented
        return np.array_equal(self.steps, other.steps) and all(
            np.array_equal(a, b, equal_nan=True) for a, b in zip(self.values(), other.values(), strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def values(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.step_time, self.ideal_time, self.slowdown

    def rows(self) -> list[dict[str, Any]]:
        """JSON rows `{step, step_time, ideal_time, slowdown}`, null where a value is NaN."""
        columns = [json_floats(c) for c in self.values()]
        return [
            {"step": step, "step_time": t, "ideal_time": i, "slowdown": s}
            for step, t, i, s in zip(self.steps.tolist(), *columns, strict=True)
        ]


def json_floats(values: Any) -> list[float | None]:
    """JSON-able floats of an array, None where a value is not finite (one tolist, not a
    float() and isfinite() per value: a pass builds these for every job)."""
    column = np.asarray(values, dtype=np.float64)
    out: list[float | None] = column.tolist()
    for i in np.flatnonzero(~np.isfinite(column)).tolist():
        out[i] = None
    return out
