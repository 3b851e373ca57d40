"""Turn stored agent step records into the engine's operation table.

Each span an agent timed becomes one operation of the matching op type (DESIGN §5). Three things
happen on the way:
- A span nested in another (a GC pause inside forward, a custom phase inside a step phase) is
  carved out of the enclosing op, which keeps only its exclusive time: no double counting.
- Every stretch of the step no span covers becomes a `host` op (untimed host work: logging,
  evaluation loops, clipping, sleeps), so the replayed step is the real one and work outside the
  timed phases can be blamed like any other.
- Steps are re-cut at the step's last collective (the DDP gradient all-reduce): what a rank does
  after it (optimizer, a GC pause, rank 0's evaluation) delays the *next* step's collective on
  every other rank, so it is replayed as the start of that next step. The collective ends at the
  same instant on every rank, so every rank's replayed step then starts together, as the replay
  assumes. The first step of each run of consecutive steps only lends its tail to the next one
  (its own start is not in the rows), so callers pass one step before the window they want. A
  job without collectives keeps the agent's boundaries (the optimizer step).
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
    host_ids: dict[tuple[str, int], int] = {}  # (op type it precedes, its occurrence) -> host seq_id
    lead_tp: dict[tuple[int, int], int] = {}
    rows = list(rows)
    for r in rows:
        key = (r.dp_rank, r.pp_rank)
        lead_tp[key] = min(lead_tp.get(key, r.tp_rank), r.tp_rank)

    cols: dict[str, list[Any]] = {name: [] for name in OpTable.COLUMNS}
    lead = sorted(
        (r for r in rows if r.tp_rank == lead_tp[(r.dp_rank, r.pp_rank)]), key=lambda r: (r.rank, r.step)
    )
    # The previous step's tail: ops after its last collective (absolute times), which rank and
    # step it belongs to, and where it starts (that collective's end).
    carry: list[_Op] = []
    carried_by: tuple[int, int] | None = None
    carry_start = 0.0
    for r in lead:
        mb_sq = {int(m[0]): float(m[3]) for m in r.microbatch_seq}
        own = [(t, r.start_time + a, d, mb, ch, r.start_time + e) for t, a, d, mb, ch, e in _operations(r)]
        continues = carried_by == (r.rank, r.step - 1)
        window_start, ops = (carry_start, carry + own) if continues else (r.start_time, own)
        cut = max((e for t, _, _, _, _, e in own if t in O.COLLECTIVE_OP_TYPES), default=None)
        if cut is None:  # no collective seen: the agent's own step boundary
            window_end, carry, carried_by = r.start_time + float(r.duration), [], None
        else:
            window_end = cut
            carry = [op for op in ops if op[1] >= cut]
            ops = [op for op in ops if op[1] < cut]
            carried_by, carry_start = (r.rank, r.step), cut
            if not continues:  # its start is cut off (the window's first step): only feeds the next
                continue
        relative = [(t, a - window_start, d, mb, ch, e - window_start) for t, a, d, mb, ch, e in ops]
        for op in _with_host_work(relative, window_end - window_start):
            op_type, start, duration, microbatch, chunk, seq_id, precedes = op
            code = names.setdefault(op_type, len(names))
            if op_type == O.HOST:  # named by the op it precedes, so steps with and without it align
                seq_id = host_ids.setdefault((precedes, seq_id), len(host_ids))
            cols["dp_rank"].append(r.dp_rank)
            cols["stage"].append(r.pp_rank)
            cols["step"].append(r.step)
            cols["op_type"].append(code)
            cols["seq_id"].append(seq_id)
            cols["chunk"].append(chunk)
            cols["microbatch"].append(microbatch)
            cols["start"].append(window_start + start)
            cols["duration"].append(duration)
            cols["rank"].append(r.rank)
            cols["seq_sq"].append(_seq_sq(op_type, microbatch, mb_sq, r.seq_sum_sq))

    arrays = {name: np.asarray(cols[name], dtype=dtype) for name, dtype in OpTable.COLUMNS.items()}
    return OpTable(op_types=tuple(names), ends_at_last_op=True, **arrays)


def _seq_sq(op_type: str, microbatch: int, per_mb: dict[int, float], step_sq: float) -> float:
    if op_type not in (O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE):
        return float("nan")
    if microbatch >= 0 and microbatch in per_mb:
        return per_mb[microbatch]
    if microbatch < 0 and step_sq > 0:
        return step_sq
    return float("nan")


# (op type, start relative to the step, exclusive duration, microbatch, chunk, end of its interval)
_Op = tuple[str, float, float, int, int, float]
# What build_op_table consumes: (op type, start, duration, microbatch, chunk, seq_id, precedes)
_Numbered = tuple[str, float, float, int, int, int, str]

# Gaps shorter than this between timed phases are timer noise, not host work.
MIN_HOST_GAP = 1e-6


def _with_host_work(ops: list[_Op], step_duration: float) -> list[_Numbered]:
    """Number each op type's occurrences and add a `host` op for every stretch of the step that no
    timed op covers: every second of the step is then in some op, so the replay is the real step.

    A host op's seq_id is the occurrence of the op it precedes (the tail: of the step's end), so
    rank 0's occasional evaluation or a sleep before each micro-step's forward line up across
    steps and workers; the caller renumbers (op type, occurrence) pairs into dense seq_ids."""
    out: list[_Numbered] = []
    counts: dict[str, int] = {}
    cursor = 0.0
    for op_type, start, duration, microbatch, chunk, end in ops:
        occurrence = counts.get(op_type, 0)
        counts[op_type] = occurrence + 1
        if start - cursor > MIN_HOST_GAP:
            out.append((O.HOST, cursor, start - cursor, -1, 0, occurrence, op_type))
        out.append((op_type, start, duration, microbatch, chunk, occurrence, ""))
        cursor = max(cursor, end)
    if step_duration - cursor > MIN_HOST_GAP:
        out.append((O.HOST, cursor, step_duration - cursor, -1, 0, 0, "<end>"))
    return out


def _operations(r: StepLike) -> list[_Op]:
    """The record's timed operations in start order, each with its *exclusive* duration: time
    spent in a phase nested inside it (a GC pause, a custom phase inside forward) is carved out of
    the enclosing op, so the replay does not count it twice."""
    if not r.spans:
        out: list[_Op] = []
        offset = 0.0
        ordered = [p for p in PHASE_ORDER if p in r.phases]
        ordered += sorted(p for p in r.phases if p not in PHASE_ORDER and p not in ("gc", "other"))
        for phase in ordered:
            duration = float(r.phases[phase])
            out.append((SPAN_OP_TYPES.get(phase, phase), offset, duration, -1, 0, offset + duration))
            offset += duration
        return out

    spans = sorted(
        ((str(s[0]), float(s[1]), float(s[2]), int(s[3]), int(s[4])) for s in r.spans),
        key=lambda s: (s[1], -s[2]),  # an enclosing span before the ones it contains
    )
    out = []
    for i, (kind, start, duration, microbatch, chunk) in enumerate(spans):
        end = start + duration
        nested = []
        for _, c_start, c_duration, _, _ in spans[i + 1 :]:  # sorted: children follow their parent
            if c_start >= end:
                break
            if c_start + c_duration <= end + 1e-9:
                nested.append((c_start, c_start + c_duration))
        exclusive = max(0.0, duration - _union_length(nested)) if nested else duration
        out.append((SPAN_OP_TYPES.get(kind, kind), start, exclusive, microbatch, chunk, end))
    return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -np.inf
    for lo, hi in sorted(intervals):
        if hi <= reach:
            continue
        total += hi - max(lo, reach)
        reach = hi
    return total
