"""Which steps of a window a pass treats apart: the warm-up after each start or restart (left out
of the analysis), and the recent stretch (analysed again on its own)."""

from __future__ import annotations

from collections.abc import Sequence


def recent_from(
    times: Sequence[tuple[int, float, float]], seconds: float, min_steps: int, max_steps: int | None = None
) -> int | None:
    """First step of the recent stretch: the steps that ended within `seconds` of the newest, at
    least `min_steps` and at most `max_steps` of them; None when that is the whole window (the
    window's answer stands)."""
    if len(times) <= min_steps:
        return None
    newest = max(end for _, _, end in times)
    ordered = sorted(times)
    recent = [step for step, _, end in ordered if end >= newest - seconds]
    first = min(recent[0] if recent else ordered[-1][0], ordered[-min_steps][0])
    most = None if max_steps is None else max(max_steps, min_steps)  # the minimum wins
    if most is not None and len(ordered) > most:
        first = max(first, ordered[-most][0])
    return None if first <= ordered[0][0] else first


def warmup_ranges(starts: Sequence[int], warmup_steps: int) -> list[tuple[int, int]]:
    """[first, first + warmup) for every start or restart of the job's agents."""
    return [(s, s + warmup_steps) for s in starts] if warmup_steps > 0 else []
