"""A job's history beyond its analysis window: the rollup behind `GET /jobs/{id}/trend`.

A pass analyses the newest 500 steps; an on-call engineer also asks "since when?", and a finished
job's raw steps go after SMON_RETENTION_DAYS. So each pass folds its per-step series into buckets
of BUCKET_STEPS consecutive steps stored in `job_trend`: each step's measured and ideal step time
(float32), the bucket's wall-clock span, and the stragglers of the passes that saw it. A pass
overwrites only the steps it analysed; the rest of a bucket keeps what earlier passes stored, so a
window sliding through a bucket never loses its older steps. About 10 bytes per step: a
million-step job's history is 10 MB, read a bucket at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.series import StepSeries
from smon_server.store.models import AnalysisResult, JobTrend

BUCKET_STEPS = 50


def buckets(series: StepSeries, times: Sequence[tuple[int, float, float]]) -> list[dict[str, Any]]:
    """One pass's per-step series grouped by bucket."""
    when = {step: (start, end) for step, start, end in times}
    of_step = series.steps // BUCKET_STEPS
    out = []
    for bucket in np.unique(of_step).tolist():
        members = np.flatnonzero(of_step == bucket)
        steps = series.steps[members].tolist()
        spans = [when[step] for step in steps if step in when]
        out.append(
            {
                "bucket": bucket,
                "steps": steps,
                "step_times": series.step_time[members].tolist(),
                "ideal_times": series.ideal_time[members].tolist(),
                "start_time": min((a for a, _ in spans), default=None),
                "end_time": max((b for _, b in spans), default=None),
            }
        )
    return out


def store(session: Session, result: AnalysisResult, rows: Sequence[dict[str, Any]], now: float) -> None:
    """Merge one pass's buckets into the stored ones, with the stragglers and leading cause of its
    stored analysis `result` (the caller holds the job's lease)."""
    if not rows:
        return
    job_id, attempt = result.job_id, result.attempt
    stragglers = [int(s["rank"]) for s in (result.summary or {}).get("stragglers") or []]
    stored = {
        r.bucket: r
        for r in session.scalars(
            select(JobTrend).where(
                JobTrend.job_id == job_id,
                JobTrend.attempt == attempt,
                JobTrend.bucket.in_([b["bucket"] for b in rows]),
            )
        )
    }
    for b in rows:
        row = stored.get(b["bucket"])
        if row is None:
            row = JobTrend(
                job_id=job_id,
                attempt=attempt,
                bucket=b["bucket"],
                step_times=_empty(),
                ideal_times=_empty(),
                stragglers=[],
            )
            session.add(row)
        at = np.asarray(b["steps"], dtype=np.int64) - b["bucket"] * BUCKET_STEPS
        step_times, ideal_times = _unpack(row.step_times), _unpack(row.ideal_times)
        step_times[at], ideal_times[at] = b["step_times"], b["ideal_times"]
        row.step_times, row.ideal_times = step_times.tobytes(), ideal_times.tobytes()
        present = np.flatnonzero(~np.isnan(step_times))
        row.first_step = b["bucket"] * BUCKET_STEPS + int(present[0])
        row.last_step = b["bucket"] * BUCKET_STEPS + int(present[-1])
        starts = [t for t in (row.start_time, b["start_time"]) if t is not None]
        ends = [t for t in (row.end_time, b["end_time"]) if t is not None]
        row.start_time, row.end_time = min(starts, default=None), max(ends, default=None)
        row.stragglers = sorted({*row.stragglers, *stragglers})
        row.leading_cause = result.leading_cause
        row.computed_at = now


def read(
    session: Session,
    job_id: str,
    *,
    attempt: int,
    from_step: int | None,
    to_step: int | None,
    max_points: int,
) -> list[dict[str, Any]]:
    """The job attempt's analysed steps in [from_step, to_step], merged into at most `max_points`
    points of consecutive buckets (means weighted by steps), so a long job's answer stays small."""
    query = (
        select(JobTrend)
        .where(JobTrend.job_id == job_id, JobTrend.attempt == attempt)
        .order_by(JobTrend.bucket)
    )
    if from_step is not None:
        query = query.where(JobTrend.last_step >= from_step)
    if to_step is not None:
        query = query.where(JobTrend.first_step <= to_step)
    rows = list(session.scalars(query))
    per_point = max(1, -(-len(rows) // max(1, max_points)))
    points = (_merge(rows[i : i + per_point], from_step, to_step) for i in range(0, len(rows), per_point))
    return [p for p in points if p is not None]


def _merge(rows: Sequence[JobTrend], from_step: int | None, to_step: int | None) -> dict[str, Any] | None:
    step = np.concatenate([r.bucket * BUCKET_STEPS + np.arange(BUCKET_STEPS) for r in rows])
    measured = np.concatenate([_unpack(r.step_times) for r in rows]).astype(np.float64)
    ideal = np.concatenate([_unpack(r.ideal_times) for r in rows]).astype(np.float64)
    keep = ~np.isnan(measured)
    if from_step is not None:
        keep &= step >= from_step
    if to_step is not None:
        keep &= step <= to_step
    if not keep.any():
        return None
    step_time, ideal_time = float(measured[keep].mean()), float(ideal[keep].mean())
    causes = Counter(r.leading_cause for r in rows if r.leading_cause)
    return {
        "from_step": int(step[keep][0]),
        "to_step": int(step[keep][-1]),
        "steps": int(keep.sum()),
        "start_time": min((r.start_time for r in rows if r.start_time is not None), default=None),
        "end_time": max((r.end_time for r in rows if r.end_time is not None), default=None),
        "step_time": step_time,
        "ideal_time": ideal_time,
        "slowdown": step_time / ideal_time if ideal_time > 0 else None,
        "stragglers": sorted({int(rank) for r in rows for rank in r.stragglers}),
        "leading_cause": causes.most_common(1)[0][0] if causes else "",
    }


def _empty() -> bytes:
    return np.full(BUCKET_STEPS, np.nan, dtype=np.float32).tobytes()


def _unpack(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.float32).copy()
