"""Measured durations D (compute time, or transfer time for communication) and idealised D*.

A communication op's recorded duration mixes moving bytes with waiting for the slowest peer;
only the transfer part belongs to the op (`transfer_i = end_i - max_{j in G} start_j`, at least
0). The waiting part is re-created by the replay from whoever is late, so a slow worker's delay
shows up where it is caused, not in every peer's collective.

D*: per op type, over every instance in the window: compute -> the mean (over all stages too,
which is what models a balanced partition), communication -> the median transfer time. Absent
instances (a `gc` op on steps without a collection) count as zero-cost compute instances, so D* of
an occasional phase is its average cost per step; absent communication instances are left out of
the median. One D* per op type makes the ideal step identical on every step and DP replica.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smon_server.whatif.graph import StepGraph
from smon_server.whatif.layout import StepLayout


@dataclass(frozen=True)
class Durations:
    measured: np.ndarray  # [n_slots, n_steps, n_dp]: compute duration / comm transfer
    ideal: np.ndarray  # [n_slots] D* of each slot's op type
    ideal_by_type: dict[str, float]
    trace_step_time: np.ndarray  # [n_steps]: latest end - earliest start, as recorded


def measure(layout: StepLayout, graph: StepGraph, *, release_start: bool = True) -> Durations:
    """Transfer times, trace step times and D*. With `release_start` the layout's start array is
    dropped afterwards (the replay never needs it; on large jobs it is a third of the memory)."""
    start, duration, present = layout.start, layout.duration, layout.present
    n_slots, n_steps, _ = start.shape
    first = np.full(n_steps, np.inf, dtype=start.dtype)
    last = np.full(n_steps, -np.inf, dtype=start.dtype)
    with np.errstate(invalid="ignore"):
        for lo in range(0, n_slots, 64):  # bounded temporaries on large jobs
            s, d = start[lo : lo + 64], duration[lo : lo + 64]
            first = np.fmin(first, np.nanmin(s, axis=(0, 2)))
            last = np.fmax(last, np.nanmax(s + d, axis=(0, 2)))
    trace_step_time = last.astype(np.float64) - first

    measured = duration  # transfers overwrite the comm slots in place
    for members, spans in zip(graph.groups, graph.group_spans_dp, strict=True):
        idx = list(members)
        member_start = start[idx]  # [k, steps, dp]
        complete = bool(present[idx].all())
        if complete:
            latest = member_start.max(axis=0)
            if spans:
                latest = latest.max(axis=1, keepdims=True)
            transfer = member_start + duration[idx]
            transfer -= latest
            np.maximum(transfer, 0.0, out=transfer)
        else:
            latest = np.fmax.reduce(member_start, axis=0)
            if spans:
                latest = np.fmax.reduce(latest, axis=1, keepdims=True)
            transfer = member_start + duration[idx] - latest
            transfer = np.where(np.isnan(transfer), 0, np.maximum(transfer, 0))
        measured[idx] = transfer

    ideal_by_type: dict[str, float] = {}
    ideal = np.zeros(layout.n_slots)
    for code in np.unique(layout.slot_type):
        slots = np.flatnonzero(layout.slot_type == code)
        name = layout.op_types[int(code)]
        values = measured[slots]
        if graph.is_comm[slots[0]]:
            chosen = values[present[slots]]
            value = float(np.median(chosen)) if chosen.size else 0.0
        else:
            value = float(values.mean(dtype=np.float64))
        ideal_by_type[name] = value
        ideal[slots] = value
    if release_start:
        layout.start = np.empty((0, 0, 0))
        layout.present = np.empty((0, 0, 0), dtype=bool)
    return Durations(
        measured=measured, ideal=ideal, ideal_by_type=ideal_by_type, trace_step_time=trace_step_time
    )
