"""A deliberately plain what-if simulator, per operation, used only to cross-check the fast engine.

It reads the op table row by row, builds the dependency graph of each step with dictionaries,
evaluates it by depth-first memoised recursion, and runs each what-if variant as its own full
simulation. It shares no code with the engine beyond the op type names, so agreement between the
two is evidence about both. Semantics (DESIGN §5 plus the decisions in docs/analysis.md):

- per worker, non-p2p ops run in recorded (start) order; each p2p kind is a stream by seq_id;
- the k-th send follows the k-th compute of its direction that has a neighbour to send to; the
  k-th recv feeds the k-th compute that has one to receive from, and waits for the compute before
  that one (same direction);
- communication ends at max(start over its group) + transfer; compute at start + duration;
- groups: send/recv pairs; DP collectives over the DP ranks of a stage; embedding all-reduce over
  the stages of a replica; grad-norm clip over everything; layernorm all-reduce alone;
- D*: compute -> mean, communication -> median transfer, per op type.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.ops import OpTable

P2P = {O.FORWARD_SEND, O.FORWARD_RECV, O.BACKWARD_SEND, O.BACKWARD_RECV}


class ReferenceStep:
    def __init__(self, table: OpTable, rows: np.ndarray, n_stages: int, n_chunks: int) -> None:
        self.rows = rows
        name = [table.op_types[int(table.op_type[r])] for r in rows]
        self.name = name
        self.dp = [int(table.dp_rank[r]) for r in rows]
        self.stage = [int(table.stage[r]) for r in rows]
        self.seq = [int(table.seq_id[r]) for r in rows]
        self.chunk = [int(table.chunk[r]) for r in rows]
        self.start = [float(table.start[r]) for r in rows]
        self.duration = [float(table.duration[r]) for r in rows]
        n = len(rows)
        self.deps: list[list[int]] = [[] for _ in range(n)]
        self.group: list[list[int] | None] = [None] * n
        workers: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i in range(n):
            workers[(self.dp[i], self.stage[i])].append(i)
        last_chunk = n_stages * n_chunks - 1
        for (_, stage), mine in workers.items():
            mine.sort(key=lambda i: (self.start[i], i))
            main = [i for i in mine if name[i] not in P2P]
            for a, b in pairwise(main):
                self.deps[b].append(a)
            streams = {k: sorted((i for i in mine if name[i] == k), key=lambda i: self.seq[i]) for k in P2P}
            for stream in streams.values():
                for a, b in pairwise(stream):
                    self.deps[b].append(a)
            for compute, send, recv, sends_if, recvs_if in (
                (
                    O.FORWARD_COMPUTE,
                    O.FORWARD_SEND,
                    O.FORWARD_RECV,
                    lambda g: g != last_chunk,
                    lambda g: g != 0,
                ),
                (
                    O.BACKWARD_COMPUTE,
                    O.BACKWARD_SEND,
                    O.BACKWARD_RECV,
                    lambda g: g != 0,
                    lambda g: g != last_chunk,
                ),
            ):
                computes = [i for i in main if name[i] == compute]
                gchunk = [self.chunk[i] * n_stages + stage for i in computes]
                senders = [c for c, g in zip(computes, gchunk, strict=True) if sends_if(g)]
                receivers = [k for k, g in enumerate(gchunk) if recvs_if(g)]
                for s, c in zip(streams[send], senders, strict=False):
                    self.deps[s].append(c)
                for r, k in zip(streams[recv], receivers, strict=False):
                    self.deps[computes[k]].append(r)
                    if k > 0:
                        self.deps[r].append(computes[k - 1])
        keyed: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for i in range(n):
            kind = name[i]
            if kind not in O.COMMUNICATION_OP_TYPES:
                continue
            if kind == O.FORWARD_SEND:
                key: tuple[object, ...] = ("f", self.dp[i], self.stage[i], self.seq[i])
            elif kind == O.FORWARD_RECV:
                key = ("f", self.dp[i], (self.stage[i] - 1) % n_stages, self.seq[i])
            elif kind == O.BACKWARD_SEND:
                key = ("b", self.dp[i], self.stage[i], self.seq[i])
            elif kind == O.BACKWARD_RECV:
                key = ("b", self.dp[i], (self.stage[i] + 1) % n_stages, self.seq[i])
            elif kind in (
                O.PARAMS_ALL_GATHER,
                O.GRADS_REDUCE_SCATTER,
                O.GRADS_ALL_REDUCE,
                O.SEPARATE_GRADS_ALL_REDUCE,
            ):
                key = (kind, self.stage[i], self.seq[i])
            elif kind == O.EMBEDDING_GRADS_ALL_REDUCE:
                key = (kind, self.dp[i], self.seq[i])
            elif kind == O.OPTIMIZER_CLIP_MAIN_GRAD:
                key = (kind, self.seq[i])
            else:
                key = (kind, i)
            keyed[key].append(i)
        for members in keyed.values():
            for i in members:
                self.group[i] = members
        self.transfer = [0.0] * n
        for i in range(n):
            g = self.group[i]
            if g is not None:
                latest = max(self.start[j] for j in g)
                self.transfer[i] = max(0.0, self.start[i] + self.duration[i] - latest)
        self.ends_step = [i for i in range(n) if name[i] == O.OPTIMIZER] or list(range(n))
        self.trace_time = max(s + d for s, d in zip(self.start, self.duration, strict=True)) - min(self.start)

    def measured(self) -> list[float]:
        return [
            t if g is not None else d
            for t, d, g in zip(self.transfer, self.duration, self.group, strict=True)
        ]

    def simulate(self, d: list[float]) -> float:
        n = len(d)
        start: list[float | None] = [None] * n
        end: list[float | None] = [None] * n

        def s_of(i: int) -> float:
            if start[i] is None:
                start[i] = max((e_of(j) for j in self.deps[i]), default=0.0)
            return start[i]  # type: ignore[return-value]

        def e_of(i: int) -> float:
            if end[i] is None:
                g = self.group[i]
                end[i] = (max(s_of(j) for j in g) if g is not None else s_of(i)) + d[i]
            return end[i]  # type: ignore[return-value]

        return max(e_of(i) for i in self.ends_step)


def reference_steps(table: OpTable) -> dict[int, ReferenceStep]:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 200_000))
    n_stages = len(np.unique(table.stage))
    compute = np.isin(table.op_type, [table.code(O.FORWARD_COMPUTE), table.code(O.BACKWARD_COMPUTE)])
    n_chunks = int(table.chunk[compute].max()) + 1 if compute.any() else 1
    return {
        int(s): ReferenceStep(table, np.flatnonzero(table.step == s), n_stages, n_chunks)
        for s in np.unique(table.step)
    }


def reference_analysis(table: OpTable, top_fraction: float = 0.03) -> dict[str, object]:
    steps = reference_steps(table)
    measured = {s: st.measured() for s, st in steps.items()}
    ideal_of: dict[str, float] = {}
    for name in {n for st in steps.values() for n in st.name}:
        comm = name in O.COMMUNICATION_OP_TYPES
        values = [
            m[i]
            for s, st in steps.items()
            for i, m in [(i, measured[s]) for i in range(len(st.name))]
            if st.name[i] == name
        ]
        ideal_of[name] = float(np.median(values)) if comm else float(np.mean(values))

    def times(restored: Callable[[ReferenceStep, int], bool]) -> dict[int, float]:
        out = {}
        for s, st in steps.items():
            d = [measured[s][i] if restored(st, i) else ideal_of[st.name[i]] for i in range(len(st.name))]
            out[s] = st.simulate(d)
        return out

    base = times(lambda st, i: True)
    ideal = times(lambda st, i: False)
    mean_ideal = float(np.mean(list(ideal.values())))

    def add_back(pred: Callable[[ReferenceStep, int], bool]) -> tuple[float, dict[int, float]]:
        t = times(pred)
        return float(np.mean(list(t.values()))) / mean_ideal, {s: t[s] / ideal[s] for s in t}

    def family(name: str) -> str:
        return O.p2p_family(name)

    def of_type(f: str) -> Callable[[ReferenceStep, int], bool]:
        return lambda st, i: family(st.name[i]) == f

    def of_dp(d: int) -> Callable[[ReferenceStep, int], bool]:
        return lambda st, i: st.dp[i] == d

    def of_stage(p: int) -> Callable[[ReferenceStep, int], bool]:
        return lambda st, i: st.stage[i] == p

    by_type = {f: add_back(of_type(f)) for f in {family(n) for n in ideal_of}}
    dps = sorted({d for st in steps.values() for d in st.dp})
    stages = sorted({s for st in steps.values() for s in st.stage})
    by_dp = {d: add_back(of_dp(d)) for d in dps}
    by_stage = {p: add_back(of_stage(p)) for p in stages}
    worker = {(d, p): min(by_dp[d][0], by_stage[p][0]) for d in dps for p in stages}
    k = max(1, math.ceil(top_fraction * len(worker)))
    top = sorted(worker, key=lambda w: (-worker[w], dps.index(w[0]), stages.index(w[1])))[:k]
    mean_base = float(np.mean(list(base.values())))

    def removal(pred: Callable[[ReferenceStep, int], bool]) -> float:
        t = float(np.mean(list(times(lambda st, i: not pred(st, i)).values())))
        gap = mean_base - mean_ideal
        return (mean_base - t) / gap if gap > 1e-12 * mean_ideal else math.nan

    return {
        "slowdown": mean_base / mean_ideal,
        "step_time": base,
        "ideal_step_time": mean_ideal,
        "ideal_by_type": ideal_of,
        "discrepancy": float(np.mean([st.trace_time for st in steps.values()])) / mean_base,
        "by_op_type": by_type,
        "by_dp_rank": by_dp,
        "by_stage": by_stage,
        "top_workers": top,
        "m_w": removal(lambda st, i: (st.dp[i], st.stage[i]) in top),
        "m_s": removal(lambda st, i: st.stage[i] == stages[-1]),
    }
