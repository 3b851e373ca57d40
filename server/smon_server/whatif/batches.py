"""Replay batches: everything built once per analysis (`Prepared`), and variants run in chunks.

A batch is a set of what-if variants replayed together through one compiled program. Batches are
cut into [variant, step] chunks that fit a memory budget and optionally run on threads (numpy
releases the GIL inside large array operations; the replay is memory-bound, so one thread is the
default).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.durations import Durations, ideal_durations, measure
from smon_server.whatif.graph import StepGraph, build_graph
from smon_server.whatif.incremental import Reusable, Slid, cut, slide
from smon_server.whatif.layout import StepLayout, build_layout
from smon_server.whatif.ops import OpTable
from smon_server.whatif.replay import Program, compile_program, run
from smon_server.whatif.sources import (
    IdealSource,
    JitterSource,
    MaskedSource,
    ReplicaJitterSource,
    ReplicaSource,
)


@dataclass(frozen=True)
class Prepared:
    """Everything the replays need, built once per analysis."""

    layout: StepLayout
    graph: StepGraph
    durations: Durations
    program: Program
    dtype: np.dtype
    threads: int
    memory_budget: int
    # For the next analysis of the same window slid on (incremental.py), when asked to keep it.
    kept: Reusable | None = None
    slid: bool = False  # laid out from the last analysis's Reusable and the new steps alone

    @property
    def shape(self) -> tuple[int, int, int]:
        n_slots, n_steps, n_dp = self.durations.measured.shape
        return n_slots, n_steps, n_dp


def prepare(
    table: OpTable,
    config: WhatIfConfig | None = None,
    *,
    reuse: Reusable | None = None,
    keep: bool = False,
    within: Reusable | None = None,
) -> Prepared:
    """Everything the replays need. With `reuse` (what the last analysis of this window kept),
    only the steps after its newest are laid out (incremental.py); with `keep`, the result
    keeps what the next analysis of the window slid on can reuse (`Prepared.kept`). With
    `within` (what an analysis of a window ending with `table`'s steps kept), `table` is cut
    from that window's layout instead of laid out (incremental.cut)."""
    config = config or WhatIfConfig()
    single = config.precision == "single" or (config.precision == "auto" and len(table) > 1_000_000)
    dtype = np.dtype(np.float32 if single else np.float64)
    driven, floors = length_driven(table), host_floors(table)
    slid: Slid | None = None
    if reuse is not None:
        slid = slide(table, dtype, reuse)
    elif within is not None:
        slid = cut(table, dtype, within)
    if slid is None:
        layout = build_layout(table, dtype)
        graph = build_graph(layout)
        present = layout.present
        trace, measured = None, None
    else:
        layout, graph, present = slid.layout, slid.graph, slid.present
        trace, measured = slid.trace_step_time, layout.duration
    durations = (
        measure(
            layout,
            graph,
            estimator=config.estimator,
            outlier_tolerance=config.outlier_tolerance,
            jitter_sigmas=config.jitter_sigmas,
            length_driven=driven,
            host_floor=floors,
        )
        if trace is None or measured is None
        else ideal_durations(
            layout,
            graph,
            measured,
            present,
            trace,
            estimator=config.estimator,
            outlier_tolerance=config.outlier_tolerance,
            jitter_sigmas=config.jitter_sigmas,
            length_driven=driven,
            host_floor=floors,
        )
    )
    kept = None
    if keep and layout.per_step is not None:
        kept = Reusable(layout=layout, present=present, trace_step_time=durations.trace_step_time)
    threads = config.threads or min(4, os.cpu_count() or 1)
    return Prepared(
        layout=layout,
        graph=graph,
        durations=durations,
        program=compile_program(graph),
        dtype=dtype,
        threads=threads,
        memory_budget=config.memory_budget,
        kept=kept,
        slid=slid is not None,
    )


def ideal_step_time(prep: Prepared) -> float:
    """T(D*): one replica, one step, since D* is the same everywhere."""
    t = run(prep.program, IdealSource(prep.durations.ideal), (1, 1, 1), 2, np.float64)
    return float(t[0, 0])


def healthy_step_times(prep: Prepared) -> np.ndarray | None:
    """[n_steps] T_s of the healthy ideal (D* plus ordinary jitter), or None without an allowance."""
    measured, ideal, jitter = prep.durations.measured, prep.durations.ideal, prep.durations.jitter
    if jitter is None:
        return None
    n_steps, n_dp = measured.shape[1], measured.shape[2]

    def job(v0: int, v1: int, s0: int, s1: int) -> Callable[[], np.ndarray]:
        source = JitterSource(measured[:, s0:s1], ideal, jitter)
        return lambda: run(prep.program, source, (1, s1 - s0, n_dp), 2, prep.dtype)

    return _batched(prep, 1, n_steps, n_dp, job)[0]


def length_driven(table: OpTable) -> frozenset[str]:
    """Op types whose recorded sequence lengths (Σ len²) vary within the window."""
    if table.seq_sq.shape[0] != len(table):
        return frozenset()
    known = ~np.isnan(table.seq_sq)
    found = set()
    for code in np.unique(table.op_type[known]):
        values = table.seq_sq[known & (table.op_type == code)]
        if values.size and float(values.max()) > float(values.min()):
            found.add(table.op_types[int(code)])
    return frozenset(found)


def host_floors(table: OpTable) -> dict[str, float]:
    """Per compute op type with host issue times, the time a typical worker's host took to issue
    one instance (the lower median over workers of each worker's mean): no ideal runs an op faster
    than the host can issue it (whatif/inputs/host_line.py). The lower median keeps a rank whose host is
    slow out of the floor, as the robust D* keeps it out of the ideal."""
    if not table.has_host:
        return {}
    known = np.isfinite(table.host_duration)
    out: dict[str, float] = {}
    worker = table.dp_rank.astype(np.int64) * (1 << 32) + table.stage.astype(np.int64)
    for code in np.unique(table.op_type[known]):
        name = table.op_types[int(code)]
        if name == O.HOST or name in O.COMMUNICATION_OP_TYPES:
            continue
        rows = known & (table.op_type == code)
        ids, which = np.unique(worker[rows], return_inverse=True)
        means = np.bincount(which, weights=table.host_duration[rows], minlength=ids.size) / np.bincount(
            which, minlength=ids.size
        )
        out[name] = float(np.sort(means)[(means.size - 1) // 2])
    return out


def replay_restored(prep: Prepared, restore: np.ndarray) -> np.ndarray:
    """Step times [variant, step] of variants given as restore masks [variant, slot, dp]."""
    measured, ideal = prep.durations.measured, prep.durations.ideal
    n_steps, n_dp = measured.shape[1], measured.shape[2]

    def job(v0: int, v1: int, s0: int, s1: int) -> Callable[[], np.ndarray]:
        source = MaskedSource(measured[:, s0:s1], ideal, restore[v0:v1])
        shape = (v1 - v0, s1 - s0, n_dp)
        return lambda: run(prep.program, source, shape, 2, prep.dtype)

    return _batched(prep, restore.shape[0], n_steps, n_dp, job)


def replay_by_replica(prep: Prepared, healthy: bool = False) -> np.ndarray:
    """Step times [dp rank, step] of add-back by DP rank (two replicas per variant); with
    `healthy` (and a jitter allowance), of each rank at its healthy durations instead."""
    measured, ideal, jitter = prep.durations.measured, prep.durations.ideal, prep.durations.jitter
    n_steps, n_dp = measured.shape[1], measured.shape[2]

    shared = shared_deviation(measured, jitter.mean) if healthy and jitter is not None else None

    def job(v0: int, v1: int, s0: int, s1: int) -> Callable[[], np.ndarray]:
        # [slot, rank, step], contiguous: the batch is [replica, rank, step], so each replica's
        # half of a buffer is one contiguous block (a trailing replica axis of 2 made every
        # operation a strided one).
        block = np.ascontiguousarray(measured[:, s0:s1, v0:v1].transpose(0, 2, 1))
        source: ReplicaSource | ReplicaJitterSource
        if shared is not None and jitter is not None:
            source = ReplicaJitterSource(block, ideal, jitter.mean[:, v0:v1], jitter.cap, shared[:, s0:s1])
        else:
            source = ReplicaSource(block, ideal)
        shape = (2, v1 - v0, s1 - s0)
        return lambda: run(prep.program, source, shape, 0, prep.dtype)

    return _batched(prep, n_dp, n_steps, 2, job)


def shared_deviation(measured: np.ndarray, mean: np.ndarray, budget: int = 32 << 20) -> np.ndarray:
    """[n_slots, n_steps]: per slot and step, the lower median over DP ranks of each instance's
    deviation from its worker's mean (0 where it did not run): what every rank lost (or gained)
    on that step together, a machine-wide stall rather than anyone's straggling. Chunked over
    slots within `budget` bytes: the median needs a partitioned copy of its block."""
    n_slots, n_steps, n_dp = measured.shape
    out = np.zeros((n_slots, n_steps), dtype=measured.dtype)
    k = (n_dp - 1) // 2
    chunk = max(1, budget // max(1, n_steps * n_dp * measured.dtype.itemsize))
    for lo in range(0, n_slots, chunk):
        block = measured[lo : lo + chunk]
        deviation = np.where(block > 0, block - mean[lo : lo + chunk, None, :], 0.0)
        out[lo : lo + chunk] = np.partition(deviation, k, axis=2)[:, :, k]
    return out


def _batched(
    prep: Prepared,
    n_variants: int,
    n_steps: int,
    replicas: int,
    job: Callable[[int, int, int, int], Callable[[], np.ndarray]],
) -> np.ndarray:
    """Split [variant, step] into chunks that fit the memory budget, one thread per chunk."""
    per_entry = max(1, prep.program.n_buffers + 2) * replicas * prep.dtype.itemsize
    max_entries = max(1, prep.memory_budget // per_entry)
    total = n_variants * n_steps
    n_chunks = max(math.ceil(total / max_entries), prep.threads if total >= 4096 else 1)
    v_chunks = min(n_variants, n_chunks)
    s_chunks = min(n_steps, math.ceil(n_chunks / v_chunks))
    v_edges = np.linspace(0, n_variants, v_chunks + 1).astype(int)
    s_edges = np.linspace(0, n_steps, s_chunks + 1).astype(int)
    tasks = [
        (int(v0), int(s0), job(int(v0), int(v1), int(s0), int(s1)))
        for v0, v1 in pairwise(v_edges)
        for s0, s1 in pairwise(s_edges)
    ]
    out = np.empty((n_variants, n_steps))
    if len(tasks) == 1 or prep.threads == 1:
        results = [task() for _, _, task in tasks]
    else:
        with ThreadPoolExecutor(max_workers=prep.threads) as pool:
            results = list(pool.map(lambda t: t[2](), tasks))
    for (v0, s0, _), result in zip(tasks, results, strict=True):
        out[v0 : v0 + result.shape[0], s0 : s0 + result.shape[1]] = result
    return out
