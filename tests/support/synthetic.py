"""Synthetic op tables of a DP x 1F1B-pipeline job with injectable stragglers.

For benchmarks, tests and demos: agent-style records (data_wait, per-micro-batch forward /
backward compute, the four p2p kinds, an exposed grads-all-reduce across DP ranks, optimizer,
occasional gc / checkpoint) whose start times come from executing the job's own dependency graph
(plus optional random launch gaps), so transfers, waits and recorded order are all consistent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.graph import StepGraph, build_graph
from smon_server.whatif.layout import build_layout
from smon_server.whatif.ops import OpTable


@dataclass(frozen=True)
class SyntheticJob:
    dp: int = 4
    pp: int = 1
    microbatches: int = 1
    vpp: int = 1  # model chunks per stage (interleaved 1F1B); microbatches a multiple of pp
    steps: int = 10
    forward: float = 0.010  # seconds per micro-batch on one stage
    backward: float = 0.020
    data_wait: float = 0.001
    p2p: float = 0.0005
    grad_sync: float = 0.004  # transfer part of the exposed gradient all-reduce
    optimizer: float = 0.002
    jitter: float = 0.02  # relative log-normal noise on every duration
    launch_gap: float = 0.0  # mean random idle gap before each op (untraced CPU work)
    slow_workers: dict[tuple[int, int], float] = field(default_factory=dict)  # (dp, stage) -> x
    stage_factor: tuple[float, ...] = ()  # compute multiplier per stage
    slow_data: dict[tuple[int, int], float] = field(default_factory=dict)  # (dp, stage) -> s
    slow_links: dict[tuple[int, int], float] = field(default_factory=dict)  # comm transfer x
    seq_spread: float = 0.0  # log-normal sigma of Σ len² per micro-batch; compute scales with it
    gc_probability: float = 0.0  # chance a worker collects in a step
    gc_seconds: float = 0.0
    checkpoint_every: int = 0  # checkpoint phase on all workers every N steps (0: never)
    checkpoint_seconds: float = 0.0
    seed: int = 0


def program(job: SyntheticJob, stage: int) -> list[tuple[str, int, int, int]]:
    """(op type, seq_id, micro-batch, model chunk) of one step on one stage, in program order:
    1F1B, interleaved over `vpp` model chunks per stage the way Megatron-LM schedules them."""
    pp, vpp = job.pp, job.vpp
    total = job.microbatches * vpp  # virtual micro-batches
    last_chunk = pp * vpp - 1
    warmup = min(total, (pp - stage - 1) * 2 + (vpp - 1) * pp if vpp > 1 else pp - stage - 1)
    # A checkpoint written after step N-1's optimizer runs before step N's first batch.
    ops: list[tuple[str, int, int, int]] = [(O.CHECKPOINT, 0, -1, 0)] if job.checkpoint_every else []
    ops.append((O.DATA_WAIT, 0, -1, 0))
    if job.gc_probability > 0:
        ops.append((O.GC, 0, -1, 0))
    count: dict[str, int] = {}

    def emit(kind: str, microbatch: int = -1, chunk: int = 0) -> None:
        seq = count.get(kind, 0)
        count[kind] = seq + 1
        ops.append((kind, seq, microbatch, chunk))

    def virtual(k: int, forward: bool) -> tuple[int, int]:
        """(micro-batch, chunk) of the k-th forward / backward on this stage."""
        in_group = k % (pp * vpp)
        chunk = in_group // pp if forward else vpp - 1 - in_group // pp
        return (k // (pp * vpp)) * pp + in_group % pp, chunk

    def forward(k: int) -> None:
        mb, chunk = virtual(k, True) if vpp > 1 else (k, 0)
        if chunk * pp + stage != 0:
            emit(O.FORWARD_RECV)
        emit(O.FORWARD_COMPUTE, mb, chunk)
        if chunk * pp + stage != last_chunk:
            emit(O.FORWARD_SEND)

    def backward(k: int) -> None:
        mb, chunk = virtual(k, False) if vpp > 1 else (k, 0)
        if chunk * pp + stage != last_chunk:
            emit(O.BACKWARD_RECV)
        emit(O.BACKWARD_COMPUTE, mb, chunk)
        if chunk * pp + stage != 0:
            emit(O.BACKWARD_SEND)

    for k in range(warmup):
        forward(k)
    for i in range(total - warmup):
        forward(warmup + i)
        backward(i)
    for i in range(total - warmup, total):
        backward(i)
    ops += [(O.GRADS_ALL_REDUCE, 0, -1, 0), (O.OPTIMIZER, 0, -1, 0)]
    return ops


def synthetic_table(job: SyntheticJob) -> OpTable:
    rng = np.random.default_rng(job.seed)
    names = (
        O.DATA_WAIT, O.GC, O.FORWARD_RECV, O.FORWARD_COMPUTE, O.FORWARD_SEND, O.BACKWARD_RECV,
        O.BACKWARD_COMPUTE, O.BACKWARD_SEND, O.GRADS_ALL_REDUCE, O.OPTIMIZER, O.CHECKPOINT,
    )  # fmt: skip
    # Skeleton: one step of one replica, start = program position, to get the template graph.
    rows = [
        (s, names.index(t), q, m, c, i)
        for s in range(job.pp)
        for i, (t, q, m, c) in enumerate(program(job, s))
    ]
    a = np.array(rows, dtype=np.int64)
    n = len(rows)
    skeleton = OpTable(
        op_types=names,
        dp_rank=np.zeros(n, np.int32),
        stage=a[:, 0].astype(np.int32),
        step=np.zeros(n, np.int64),
        op_type=a[:, 1].astype(np.int32),
        seq_id=a[:, 2].astype(np.int32),
        chunk=a[:, 4].astype(np.int16),
        microbatch=a[:, 3].astype(np.int16),
        start=a[:, 5].astype(np.float64),
        duration=np.zeros(n),
        rank=np.zeros(n, np.int32),
    )
    layout = build_layout(skeleton)
    graph = build_graph(layout)
    slot_type = [layout.type_name(j) for j in range(layout.n_slots)]
    slot_stage = layout.slot_stage
    microbatch_of = {(int(r[0]), int(r[1]), int(r[2])): int(r[3]) for r in a}
    slot_microbatch = np.array(
        [
            microbatch_of[(int(slot_stage[j]), int(layout.slot_type[j]), int(layout.slot_seq[j]))]
            for j in range(layout.n_slots)
        ]
    )
    shape = (layout.n_slots, job.steps, job.dp)

    base = {
        O.DATA_WAIT: job.data_wait, O.FORWARD_COMPUTE: job.forward, O.BACKWARD_COMPUTE: job.backward,
        O.FORWARD_SEND: job.p2p, O.FORWARD_RECV: job.p2p, O.BACKWARD_SEND: job.p2p,
        O.BACKWARD_RECV: job.p2p, O.GRADS_ALL_REDUCE: job.grad_sync, O.OPTIMIZER: job.optimizer,
        O.GC: job.gc_seconds, O.CHECKPOINT: job.checkpoint_seconds,
    }  # fmt: skip
    d = np.array([base[t] for t in slot_type])[:, None, None] * np.exp(
        job.jitter * rng.standard_normal(shape)
    )
    compute = np.array([t in (O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE) for t in slot_type])
    if job.stage_factor:
        factor = np.asarray(job.stage_factor, dtype=float)[slot_stage]
        d[compute] *= factor[compute][:, None, None]
    for (dp, stage), x in job.slow_workers.items():
        d[compute & (slot_stage == stage), :, dp] *= x
    comm = np.array([t in O.COMMUNICATION_OP_TYPES for t in slot_type])
    for (dp, stage), x in job.slow_links.items():
        d[comm & (slot_stage == stage), :, dp] *= x
    seq_sq = np.full(shape, np.nan)
    if job.seq_spread > 0:
        # Σ len² of a micro-batch: forward and backward of one micro-batch share it.
        per_mb = np.exp(job.seq_spread * rng.standard_normal((job.microbatches, *shape[1:])))
        per_mb /= per_mb.mean()
        mb = slot_microbatch[compute]
        seq_sq[compute] = per_mb[mb] * 4096.0**2
        d[compute] *= per_mb[mb]
    for (dp, stage), seconds in job.slow_data.items():
        d[np.array([t == O.DATA_WAIT for t in slot_type]) & (slot_stage == stage), :, dp] += seconds
    present = np.ones(shape, dtype=bool)
    for j, t in enumerate(slot_type):
        if t == O.GC:
            present[j] = rng.random(shape[1:]) < job.gc_probability
        elif t == O.CHECKPOINT:
            present[j] = (np.arange(job.steps) % job.checkpoint_every == job.checkpoint_every - 1)[:, None]
    d = np.where(present, d, 0.0)
    gap = job.launch_gap * rng.exponential(size=shape) if job.launch_gap > 0 else None
    start, end = timeline(graph, d, gap)

    # Steps run back to back on one wall clock.
    step_span = end.max(axis=(0, 2))
    origin = np.concatenate([[0.0], np.cumsum(step_span[:-1] + 0.001)])
    start += origin[None, :, None]
    keep = present.ravel()
    slot_i, step_i, dp_i = (x.ravel()[keep] for x in np.indices(shape, dtype=np.int32))
    stage_i = slot_stage[slot_i]
    return OpTable(
        op_types=names,
        dp_rank=dp_i,
        stage=stage_i.astype(np.int32),
        step=step_i.astype(np.int64),
        op_type=layout.slot_type[slot_i],
        seq_id=layout.slot_seq[slot_i],
        chunk=layout.slot_chunk[slot_i],
        microbatch=slot_microbatch[slot_i].astype(np.int16),
        start=start.ravel()[keep],
        duration=(end - start + origin[None, :, None]).ravel()[keep],
        rank=(stage_i * job.dp + dp_i).astype(np.int32),
        seq_sq=seq_sq.ravel()[keep] if job.seq_spread > 0 else np.empty(0),
    )


def timeline(graph: StepGraph, d: np.ndarray, gap: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of every slot [slot, step, dp], executing the graph (the generator's clock)."""
    start = np.zeros_like(d)
    end = np.zeros_like(d)
    for node in graph.order:
        j, ending = divmod(int(node), 2)
        if not ending:
            if graph.deps[j]:
                start[j] = np.max(end[list(graph.deps[j])], axis=0)
            if gap is not None:
                start[j] += gap[j]
            continue
        g = int(graph.group_of[j])
        if g < 0:
            end[j] = start[j] + d[j]
        else:
            latest = start[list(graph.groups[g])].max(axis=0)
            if graph.group_spans_dp[g]:
                latest = latest.max(axis=1, keepdims=True)
            end[j] = latest + d[j]
    return start, end
