"""A pass's result as the `analysis_results` row keeps it: the scalars lists read, and each API
view in a column of its own, so the API reads only what it serves."""

from __future__ import annotations

from typing import Any

from smon_server.store import grids, step_series
from smon_server.store.models import AnalysisResult


def store_result(row: AnalysisResult, result: dict[str, Any]) -> None:
    """Fill the stored row: the scalars lists read, and each API view in a column of its own."""
    summary = result["summary"]
    stragglers = summary.get("stragglers") or []
    diagnoses = summary.get("diagnoses") or []
    row.computed_at = result["computed_at"]
    row.step_writes_seen = result.get("step_writes")
    row.state = result["state"]
    row.from_step = summary.get("from_step")
    row.to_step = summary.get("to_step")
    row.steps_seen = summary.get("steps_seen", 0)
    row.slowdown = summary.get("slowdown")
    row.waste_fraction = summary.get("waste_fraction")
    row.window_start = result.get("window_start")
    row.window_end = result.get("window_end")
    row.stragglers = len(stragglers)
    row.worst_rank = stragglers[0]["rank"] if stragglers else None
    row.leading_cause = str(diagnoses[0]["cause"])[:32] if diagnoses else ""
    row.flagged = bool(summary.get("discrepancy_flagged"))
    recent = summary.get("recent") or {}
    row.recent_slowdown = recent.get("slowdown")
    row.recent_stragglers = [
        {"rank": s["rank"], "host": s["host"], "cause": s["cause"]} for s in recent.get("stragglers") or []
    ]
    row.step_seconds = result.get("step_seconds")
    row.top_workers = result.get("top_workers") or []
    row.summary = summary
    row.steps = step_series.pack(result["steps"])
    row.workers = result["workers"]
    row.rank_overall = result["rank_overall"]
    row.heatmap = grids.pack(result["rank_slowdown"])


def restate_result(row: AnalysisResult, result: dict[str, Any]) -> None:
    """Only the state and time of a stored result move on (its steps are no longer stored)."""
    row.state = result["state"]
    row.computed_at = result["computed_at"]
    row.summary = {**(row.summary or {}), "state": result["state"]}
