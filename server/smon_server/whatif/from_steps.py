"""Turn stored agent step records into the engine's operation table.

Each span an agent timed becomes one operation of the matching op type (DESIGN §5). Two things
happen on the way:
- GC pauses run *inside* whatever phase was open; the agent reports them as `gc` spans and the
  enclosing span keeps its wall time, so the pause is subtracted from the enclosing op here and the
  `gc` op carries it alone (no double counting in the replay).
- TP peers of one worker run in lockstep: only the lowest tp_rank of each (dp_rank, stage) worker
  is kept for the simulation (the per-rank heatmap still reads every rank's records).
Records with no spans (an agent that only reports phase totals) get their phases laid end to end
from the step's start in the canonical order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.ops import OpTable

# Agent span kind -> engine op type. Kinds not listed keep their own name (custom phases).
SPAN_OP_TYPES: dict[str, str] = {
    "data_wait": O.DATA_WAIT,
    "forward": O.FORWARD_COMPUTE,
    "backward": O.BACKWARD_COMPUTE,
    "grad_sync": O.GRADS_ALL_REDUCE,
    "optimizer": O.OPTIMIZER,
    "gc": O.GC,
    "checkpoint": O.CHECKPOINT,
    "forward_send": O.FORWARD_SEND,
    "forward_recv": O.FORWARD_RECV,
    "backward_send": O.BACKWARD_SEND,
    "backward_recv": O.BACKWARD_RECV,
}
# Phase-only records: the order a training step runs its phases in.
PHASE_ORDER = ("data_wait", "h2d", "forward", "backward", "grad_sync", "optimizer", "checkpoint")


class StepLike(Protocol):
    """The fields of one stored step record the engine reads (the store's `StepRow` has them)."""

    @property
    def rank(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def dp_rank(self) -> int: ...
    @property
    def pp_rank(self) -> int: ...
    @property
    def tp_rank(self) -> int: ...
    @property
    def start_time(self) -> float: ...
    @property
    def duration(self) -> float: ...
    @property
    def phases(self) -> Mapping[str, float]: ...
    @property
    def spans(self) -> Sequence[Sequence[Any]]: ...
    @property
    def seq_sum_sq(self) -> float: ...
    @property
    def microbatch_seq(self) -> Sequence[Sequence[Any]]: ...


Row = TypeVar("Row", bound=StepLike)


def complete_steps(rows: Iterable[Row]) -> list[Row]:
    """Keep the steps every reporting worker has finished (the newest step is often partial)."""
    rows = list(rows)
    workers = {(r.dp_rank, r.pp_rank) for r in rows}
    per_step: dict[int, set[tuple[int, int]]] = {}
    for r in rows:
        per_step.setdefault(r.step, set()).add((r.dp_rank, r.pp_rank))
    full = {step for step, seen in per_step.items() if len(seen) == len(workers)}
    return [r for r in rows if r.step in full]


def build_op_table(rows: Iterable[StepLike]) -> OpTable:
    names: dict[str, int] = {}
    lead_tp: dict[tuple[int, int], int] = {}
    rows = list(rows)
    for r in rows:
        key = (r.dp_rank, r.pp_rank)
        lead_tp[key] = min(lead_tp.get(key, r.tp_rank), r.tp_rank)

    cols: dict[str, list[Any]] = {name: [] for name in OpTable.COLUMNS}
    for r in rows:
        if r.tp_rank != lead_tp[(r.dp_rank, r.pp_rank)]:
            continue
        mb_sq = {int(m[0]): float(m[3]) for m in r.microbatch_seq}
        counts: dict[str, int] = {}
        for op_type, start, duration, microbatch, chunk in _operations(r):
            code = names.setdefault(op_type, len(names))
            seq_id = counts.get(op_type, 0)
            counts[op_type] = seq_id + 1
            cols["dp_rank"].append(r.dp_rank)
            cols["stage"].append(r.pp_rank)
            cols["step"].append(r.step)
            cols["op_type"].append(code)
            cols["seq_id"].append(seq_id)
            cols["chunk"].append(chunk)
            cols["microbatch"].append(microbatch)
            cols["start"].append(r.start_time + start)
            cols["duration"].append(duration)
            cols["rank"].append(r.rank)
            cols["seq_sq"].append(_seq_sq(op_type, microbatch, mb_sq, r.seq_sum_sq))

    arrays = {name: np.asarray(cols[name], dtype=dtype) for name, dtype in OpTable.COLUMNS.items()}
    return OpTable(op_types=tuple(names), **arrays)


def _seq_sq(op_type: str, microbatch: int, per_mb: dict[int, float], step_sq: float) -> float:
    if op_type not in (O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE):
        return float("nan")
    if microbatch >= 0 and microbatch in per_mb:
        return per_mb[microbatch]
    if microbatch < 0 and step_sq > 0:
        return step_sq
    return float("nan")


def _operations(r: StepLike) -> list[tuple[str, float, float, int, int]]:
    """(op type, start relative to the step, duration, microbatch, chunk), in start order."""
    if not r.spans:
        out = []
        offset = 0.0
        ordered = [p for p in PHASE_ORDER if p in r.phases]
        ordered += sorted(p for p in r.phases if p not in PHASE_ORDER and p != "gc")
        for phase in ordered:
            duration = float(r.phases[phase])
            out.append((SPAN_OP_TYPES.get(phase, phase), offset, duration, -1, 0))
            offset += duration
        return out

    spans = sorted(
        ((str(s[0]), float(s[1]), float(s[2]), int(s[3]), int(s[4])) for s in r.spans),
        key=lambda s: s[1],
    )
    gcs = [(start, start + duration) for kind, start, duration, _, _ in spans if kind == "gc"]
    out = []
    for kind, start, duration, microbatch, chunk in spans:
        if kind != "gc" and gcs:
            end = start + duration
            inside = sum(
                min(g_end, end) - max(g_start, start)
                for g_start, g_end in gcs
                if g_start < end and g_end > start
            )
            duration = max(0.0, duration - inside)
        out.append((SPAN_OP_TYPES.get(kind, kind), start, duration, microbatch, chunk))
    return out
