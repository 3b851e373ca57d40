"""Which steps of a window a pass treats apart: the warm-up after each start or restart (left out
of the analysis), and the recent stretch (analysed again on its own)."""

from __future__ import annotations

from collections.abc import Sequence

from smon_server.settings import Settings


def window_steps(settings: Settings, ranks: int | None) -> int:
    """The steps of a job's default window: SMON_ANALYSIS_WINDOW_STEPS, fewer where that many
    steps of every rank would pass SMON_ANALYSIS_WINDOW_RANK_STEPS, at least
    SMON_ANALYSIS_WINDOW_MIN_STEPS (docs/server.md "The default window"). A pass over 500 steps
    of a 16,384-rank job replays four times the operations of a 4,096-rank one's (9.1 s and a
    6 GB peak a later pass on the project's machine, 5.2 s and 1.7 GB over 128 steps); 128 steps
    of 16,384 ranks are as many rank-steps as 500 of 4,096, and enough for D* (two million
    instances an op type) and for each worker's S_w. `ranks`: the ranks that reported
    (queries.reporting_ranks), not the world size a client declared."""
    most = settings.analysis_window_steps
    by_size = settings.analysis_window_rank_steps // max(1, ranks or 1)
    return min(most, max(by_size, settings.analysis_window_min_steps))


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


def recent_steps_most(settings: Settings, ranks: int | None) -> int:
    """At most this many steps in the recent stretch: SMON_RECENT_MAX_STEPS, and no more than a
    tenth of the job's default window (50 of 500 steps; 12 of a 16,384-rank job's 128, which
    were 40% of its window and ~0.8 s of its pass). Never fewer than SMON_RECENT_MIN_STEPS."""
    tenth = window_steps(settings, ranks) // 10
    return max(settings.recent_min_steps, min(settings.recent_max_steps, tenth))
