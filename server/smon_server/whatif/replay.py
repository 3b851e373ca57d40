"""Vectorised replay of the step graph: one pass over the slots, every step / replica / variant at once.

The graph of one replica is compiled once into a short program (one instruction per start / end
node, in topological order) that names value buffers. Running the program evaluates each node on
arrays shaped like the batch, e.g. [variant, step, dp]: so the Python loop runs over the slots of
one replica (hundreds), never over operations (millions). Buffers are recycled as soon as their
last reader has run, which keeps memory at (live values) x (batch size) instead of
(slots) x (batch size).

Semantics per node (launch delay removed): start_j = max over deps of end; compute end_j =
start_j + d_j; communication end_j = max over its group's starts (and over the DP axis when the
group spans DP ranks) + d_j. The step time is the latest end over the graph's end slots and the
DP axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from smon_server.whatif.graph import StepGraph

# Instruction codes.
_START, _END, _GROUP, _END_COMM, _ACCUM = range(5)
Instruction = tuple[int, int, int, tuple[int, ...]]  # (code, slot or group, out buffer, inputs)


class DurationSource(Protocol):
    """Adds a slot's durations for every batch entry: out = start + d_slot (out may be start)."""

    def add(self, slot: int, start: np.ndarray, out: np.ndarray) -> None: ...


@dataclass(frozen=True)
class Program:
    instructions: tuple[Instruction, ...]
    n_buffers: int
    group_spans_dp: np.ndarray
    group_last_slot: dict[int, int]  # the member whose end is evaluated last


def compile_program(graph: StepGraph) -> Program:
    n = graph.n_slots
    # Where each value is read last (instruction positions are node positions here).
    end_readers: list[list[int]] = [[] for _ in range(n)]
    for j in range(n):
        for d in graph.deps[j]:
            end_readers[d].append(j)
    pos = np.empty(2 * n, dtype=np.int64)
    pos[graph.order] = np.arange(2 * n)
    last_end_use = np.array(
        [max((pos[2 * r] for r in end_readers[j]), default=pos[2 * j + 1]) for j in range(n)]
    )
    group_first_end = {}
    group_last_end = {}
    for g, members in enumerate(graph.groups):
        ends = [pos[2 * m + 1] for m in members]
        group_first_end[g] = min(ends)
        group_last_end[g] = max(ends)

    free: list[int] = []
    n_buffers = 0
    release_at: dict[int, list[int]] = {}

    def take(p: int, candidates: tuple[int, ...] = ()) -> int:
        """A buffer for a new value: one whose last read is this very node if any (updated in
        place, saving a copy), else a free one, else a new one."""
        nonlocal n_buffers
        due = release_at.get(p, [])
        for buf in candidates:
            if buf in due:
                due.remove(buf)
                return buf
        if free:
            return free.pop()
        n_buffers += 1
        return n_buffers - 1

    def release(buf: int, at: int) -> None:
        release_at.setdefault(at, []).append(buf)

    end_buf = np.full(n, -1, dtype=np.int64)
    start_buf = np.full(n, -1, dtype=np.int64)
    group_buf: dict[int, int] = {}
    is_end = np.zeros(n, dtype=bool)
    is_end[graph.end_slots] = True
    program: list[Instruction] = []
    for p, node in enumerate(graph.order):
        j, ending = divmod(int(node), 2)
        g = int(graph.group_of[j])
        if not ending:
            inputs = tuple(int(end_buf[d]) for d in graph.deps[j])
            buf = take(p, inputs)
            program.append((_START, j, buf, inputs))
            if g < 0:
                end_buf[j] = buf  # a compute op's end overwrites its start in place
            else:
                start_buf[j] = buf
                release(buf, group_first_end[g])
        else:
            if g < 0:
                program.append((_END, j, int(end_buf[j]), ()))
            else:
                spans = bool(graph.group_spans_dp[g])
                if g not in group_buf:
                    members = tuple(int(start_buf[m]) for m in graph.groups[g])
                    if len(members) == 1 and not spans:
                        group_buf[g] = members[0]  # alias: a single member's start is the max
                        release_at[p].remove(members[0])
                    else:
                        group_buf[g] = take(p, members)
                        program.append((_GROUP, g, group_buf[g], members))
                    # A DP-spanning maximum lives on reduced (by group id); its full buffer is free.
                    release(group_buf[g], p if spans else group_last_end[g])
                gbuf = group_buf[g]
                end_buf[j] = take(p, () if spans else (gbuf,))
                program.append((_END_COMM, j, int(end_buf[j]), (g, 1) if spans else (gbuf, 0)))
            if is_end[j]:
                program.append((_ACCUM, j, int(end_buf[j]), ()))
            release(int(end_buf[j]), int(last_end_use[j]))
        free.extend(release_at.pop(p, []))
    last_slot = {g: max(members, key=lambda m: int(pos[2 * m + 1])) for g, members in enumerate(graph.groups)}
    return Program(tuple(program), n_buffers, graph.group_spans_dp, last_slot)


def run(
    program: Program,
    source: DurationSource,
    shape: tuple[int, ...],
    dp_axis: int,
    dtype: npt.DTypeLike = np.float64,
) -> np.ndarray:
    """Step times for every batch entry: `shape` without `dp_axis`."""
    buffers = [np.empty(shape, dtype=dtype) for _ in range(program.n_buffers)]
    reduced: dict[int, np.ndarray] = {}  # group maxima reduced over the DP axis, by group
    step_time = np.zeros(shape, dtype=dtype)
    group_last = program.group_last_slot
    maximum = np.maximum
    for code, j, out, inputs in program.instructions:
        if code in (_START, _GROUP):
            dst = buffers[out]
            if not inputs:
                dst.fill(0.0)
            elif out in inputs:  # updated in place: out was the last read of one input
                for k in inputs:
                    if k != out:
                        maximum(dst, buffers[k], out=dst)
            elif len(inputs) == 1:
                np.copyto(dst, buffers[inputs[0]])
            else:
                maximum(buffers[inputs[0]], buffers[inputs[1]], out=dst)
                for k in inputs[2:]:
                    maximum(dst, buffers[k], out=dst)
            if code == _GROUP and program.group_spans_dp[j]:
                reduced[j] = dst.max(axis=dp_axis, keepdims=True)
        elif code == _END:
            source.add(j, buffers[out], buffers[out])
        elif code == _END_COMM:
            group, spans = inputs
            source.add(j, reduced[group] if spans else buffers[group], buffers[out])
            if spans and group_last[group] == j:
                del reduced[group]
        else:
            maximum(step_time, buffers[out], out=step_time)
    return step_time.max(axis=dp_axis)
