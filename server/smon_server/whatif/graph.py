"""The dependency graph of one step of one DP replica (DESIGN §5), over layout slots.

Every step and every DP replica run the same program, so one graph over the slots of one replica
describes them all; the replay evaluates it over arrays that carry the step, DP and variant axes.

Edges (`deps[j]`: slot j starts when all of them have ended):
- main stream: each worker's non-p2p ops (compute, collectives, gc, optimizer, custom phases)
  in recorded order;
- p2p streams: each of forward-send / forward-recv / backward-send / backward-recv is its own
  stream on a worker, ordered by seq_id;
- a send waits for the compute that produced it: the k-th forward-send of a stage follows the
  k-th forward compute that has a next stage (global chunk not last), the k-th backward-send the
  k-th backward compute that has a previous one (global chunk not 0);
- a compute waits for the recv of its input (the same k-th pairing on the receiving side);
- a recv is posted once the worker has finished the previous compute of the same direction:
  the recv feeding forward k waits for forward k-1 (a single receive buffer per direction).
  This edge is what the published results need (AR and SE steps otherwise come out a few ms
  short, always where a cool-down recv is posted late); with it all three traces replay exactly.

Groups (`group_of[j]`: a communication slot ends at max over its group's starts + its transfer):
- p2p: a send on stage s with the recv of the same seq_id on stage s+1 (backward: s-1), same DP
  replica; neighbours wrap around for interleaved schedules;
- params-all-gather, grads-reduce-scatter, grads-all-reduce, separate-grads-all-reduce: the same
  slot on every DP rank of the stage (`spans_dp`);
- embedding-grads-all-reduce: the same (op type, seq_id) on every stage of one replica (first and
  last stage hold the tied embedding);
- optimizer-clip-main-grad (the grad-norm all-reduce): every stage of every replica, a global sync;
- layernorm-grads-all-reduce: the worker alone (its TP group is folded into the worker).
The transfer-vs-waiting split uses the same groups (`transfer_i = end_i - max_j start_j`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.layout import AnalysisError, StepLayout

DP_SCOPED = frozenset(
    {O.PARAMS_ALL_GATHER, O.GRADS_REDUCE_SCATTER, O.GRADS_ALL_REDUCE, O.SEPARATE_GRADS_ALL_REDUCE}
)
STAGE_SCOPED = frozenset({O.EMBEDDING_GRADS_ALL_REDUCE})
GLOBAL_SCOPED = frozenset({O.OPTIMIZER_CLIP_MAIN_GRAD})
STEP_END_OP = O.OPTIMIZER


@dataclass(frozen=True)
class StepGraph:
    n_slots: int
    is_comm: np.ndarray  # [n_slots] bool
    deps: tuple[tuple[int, ...], ...]  # per slot
    group_of: np.ndarray  # [n_slots] group id, -1 for compute slots
    groups: tuple[tuple[int, ...], ...]  # member slots per group (within one replica)
    group_spans_dp: np.ndarray  # [n_groups] bool: the group also spans every DP replica
    order: np.ndarray  # node ids in topological order: 2*slot = start, 2*slot+1 = end
    end_slots: np.ndarray  # the step ends at the latest end among these


def build_graph(layout: StepLayout) -> StepGraph:
    n = layout.n_slots
    names = [layout.type_name(j) for j in range(n)]
    is_comm = np.array([name in O.COMMUNICATION_OP_TYPES for name in names], dtype=bool)
    deps: list[list[int]] = [[] for _ in range(n)]
    n_stages = len(layout.stages)
    n_chunks = int(layout.slot_chunk.max()) + 1 if n else 1
    last_global_chunk = n_stages * n_chunks - 1

    by_stage_kind: dict[tuple[int, str], list[int]] = {}
    for j in np.lexsort((layout.slot_seq, layout.slot_type)):
        by_stage_kind.setdefault((int(layout.slot_stage[j]), names[j]), []).append(int(j))

    for s in range(n_stages):
        main = [int(j) for j in layout.main_order[s]]
        for a, b in pairwise(main):
            deps[b].append(a)
        for kind in O.P2P_OP_TYPES:
            stream = by_stage_kind.get((s, kind), [])
            for a, b in pairwise(stream):
                deps[b].append(a)
        for direction, send, recv in (
            (O.FORWARD_COMPUTE, O.FORWARD_SEND, O.FORWARD_RECV),
            (O.BACKWARD_COMPUTE, O.BACKWARD_SEND, O.BACKWARD_RECV),
        ):
            computes = [j for j in main if names[j] == direction]
            global_chunk = [int(layout.slot_chunk[j]) * n_stages + s for j in computes]
            forward = direction == O.FORWARD_COMPUTE
            no_next = last_global_chunk if forward else 0
            no_prev = 0 if forward else last_global_chunk
            producers = [j for j, g in zip(computes, global_chunk, strict=True) if g != no_next]
            consumers = [i for i, g in enumerate(global_chunk) if g != no_prev]
            for send_slot, producer in zip(by_stage_kind.get((s, send), []), producers, strict=False):
                deps[send_slot].append(producer)
            for recv_slot, i in zip(by_stage_kind.get((s, recv), []), consumers, strict=False):
                deps[computes[i]].append(recv_slot)
                if i > 0:
                    deps[recv_slot].append(computes[i - 1])

    group_of, groups, spans = _groups(layout, names, is_comm, by_stage_kind)
    deps_t = tuple(tuple(sorted(set(d))) for d in deps)
    order = _topological_order(n, deps_t, group_of, groups)
    end_slots = np.array([j for j in range(n) if names[j] == STEP_END_OP], dtype=np.intp)
    if end_slots.size == 0 or layout.ends_at_last_op:
        # Step records cover the whole step (host work included) and are cut at the last
        # collective (from_steps.py): the step ends where its last op ends.
        end_slots = np.arange(n, dtype=np.intp)
    return StepGraph(
        n_slots=n,
        is_comm=is_comm,
        deps=deps_t,
        group_of=group_of,
        groups=groups,
        group_spans_dp=spans,
        order=order,
        end_slots=end_slots,
    )


def _groups(
    layout: StepLayout,
    names: list[str],
    is_comm: np.ndarray,
    by_stage_kind: dict[tuple[int, str], list[int]],
) -> tuple[np.ndarray, tuple[tuple[int, ...], ...], np.ndarray]:
    n_stages = len(layout.stages)
    keyed: dict[tuple[object, ...], list[int]] = {}
    spans: dict[tuple[object, ...], bool] = {}
    for j in (int(x) for x in np.flatnonzero(is_comm)):
        name, s, seq = names[j], int(layout.slot_stage[j]), int(layout.slot_seq[j])
        key: tuple[object, ...]
        if name in (O.FORWARD_SEND, O.FORWARD_RECV):
            sender = s if name == O.FORWARD_SEND else (s - 1) % n_stages
            key = ("fwd", sender, seq)
        elif name in (O.BACKWARD_SEND, O.BACKWARD_RECV):
            sender = s if name == O.BACKWARD_SEND else (s + 1) % n_stages
            key = ("bwd", sender, seq)
        elif name in DP_SCOPED:
            key = (name, s, seq)
        elif name in STAGE_SCOPED or name in GLOBAL_SCOPED:
            key = (name, seq)
        else:  # layernorm all-reduce: TP-only, folded into the worker
            key = (name, s, seq)
        keyed.setdefault(key, []).append(j)
        spans[key] = name in DP_SCOPED or name in GLOBAL_SCOPED
    group_of = np.full(len(names), -1, dtype=np.intp)
    groups: list[tuple[int, ...]] = []
    span_flags: list[bool] = []
    for key, members in keyed.items():
        for j in members:
            group_of[j] = len(groups)
        groups.append(tuple(members))
        span_flags.append(spans[key])
    return group_of, tuple(groups), np.array(span_flags, dtype=bool)


def _topological_order(
    n: int,
    deps: tuple[tuple[int, ...], ...],
    group_of: np.ndarray,
    groups: tuple[tuple[int, ...], ...],
) -> np.ndarray:
    """Kahn's algorithm over start/end nodes; a cycle means the recorded schedule is inconsistent."""
    succ: list[list[int]] = [[] for _ in range(2 * n)]
    indeg = np.zeros(2 * n, dtype=np.int64)

    def edge(a: int, b: int) -> None:
        succ[a].append(b)
        indeg[b] += 1

    for j in range(n):
        for d in deps[j]:
            edge(2 * d + 1, 2 * j)
        g = int(group_of[j])
        if g < 0:
            edge(2 * j, 2 * j + 1)
        else:
            for m in groups[g]:
                edge(2 * m, 2 * j + 1)
    ready = deque(int(v) for v in np.flatnonzero(indeg == 0))
    order: list[int] = []
    while ready:
        v = ready.popleft()
        order.append(v)
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if len(order) != 2 * n:
        raise AnalysisError(
            "the recorded schedule has a dependency cycle (a compute waits for a transfer that "
            "waits for it); check stage / seq_id numbering of the p2p ops"
        )
    return np.array(order, dtype=np.intp)
