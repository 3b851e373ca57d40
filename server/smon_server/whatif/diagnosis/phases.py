"""python_gc, data_loader, communication, checkpoint_io: slowdown that sits in one kind of phase.

python_gc / data_loader: the add-back share of the `gc` / `data_wait` op type ((S_X - 1) / (S - 1)).
communication: the add-back share of all communication transfer time together (waiting is not
transfer: a slow peer's delay lands on the peer, not here).
checkpoint_io: checkpoint phases on every rank at a fixed step interval. All ranks pause together,
so the ideal world pays the same average cost and it is not straggling; its share is the fraction
of step time spent checkpointing (docs/analysis.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.diagnosis.base import (
    CHECKPOINT_IO,
    COMMUNICATION,
    DATA_LOADER,
    PYTHON_GC,
    Diagnosis,
    Facts,
    clip01,
    most_common,
    num,
)
from smon_server.whatif.robust import median

CHECKPOINT_WORDS = ("checkpoint", "ckpt", "save")


def python_gc(f: Facts) -> list[Diagnosis]:
    share = f.addback_share(O.GC)
    gc = f.type_totals(O.GC)
    if share < f.config.min_share or gc is None:
        return []
    pauses = gc > 0
    per_step = gc.max(axis=(1, 2))
    slow = f.result.step_slowdown
    with_gc, without = slow[per_step > 0], slow[per_step == 0]
    # Planned collection as often as a rank collects now: every (steps / collections per worker).
    per_worker = max(float(pauses.sum(axis=0).mean()), 1e-9)
    every = max(1, round(gc.shape[0] / per_worker))
    coincide = 0.5
    if with_gc.size and without.size and float(with_gc.mean()) > 1.0:
        coincide = clip01((float(with_gc.mean()) - float(without.mean())) / (float(with_gc.mean()) - 1.0))
    evidence: dict[str, Any] = {
        "gc_share": num(share),
        "mean_pause_s": num(float(gc[pauses].mean())) if pauses.any() else 0.0,
        "worker_steps_with_gc": num(float(pauses.mean())),
        "slowdown_steps_with_gc": num(float(with_gc.mean())) if with_gc.size else None,
        "slowdown_steps_without_gc": num(float(without.mean())) if without.size else None,
    }
    return [
        Diagnosis(
            cause=PYTHON_GC,
            share=share,
            confidence=clip01(0.5 + 0.5 * coincide),
            evidence=evidence,
            recommendation=(
                "Python GC pauses on single ranks stall every collective. Call gc.freeze() once the "
                f"model and optimizer are built, gc.disable(), and run gc.collect() on all ranks at "
                f"the same step every {every} steps (planned GC), so nobody waits for one rank's pause."
            ),
        )
    ]


def data_loader(f: Facts) -> list[Diagnosis]:
    share = f.addback_share(O.DATA_WAIT)
    wait = f.type_totals(O.DATA_WAIT)
    if share < f.config.min_share or wait is None:
        return []
    mean = wait.mean(axis=0)  # [dp, stage]
    typical = float(median(mean))
    excess = np.maximum(mean - typical, 0.0)
    order = np.argsort(-excess, axis=None, kind="stable")
    total = float(excess.sum()) or 1.0
    named, covered = [], 0.0
    for k in order[: f.config.max_named_workers]:
        w = tuple(int(i) for i in np.unravel_index(k, mean.shape))
        if excess[w] <= 0 or covered >= 0.8 * total:
            break
        named.append(w)
        covered += float(excess[w])
    evidence: dict[str, Any] = {
        "data_wait_share": num(share),
        "median_data_wait_s": num(typical),
        "workers": [{**f.worker(*w), "data_wait_s": num(mean[w])} for w in named],
    }
    if named:
        first = named[0]
        more = f" (and {len(named) - 1} more ranks)" if len(named) > 1 else ""
        advice = (
            f"Check the data loader workers on {f.where(*first)}{more}: it waits {mean[first]:.3g} s "
            f"per step for its batch vs {typical:.3g} s on the median rank. Raise DataLoader "
            "num_workers / prefetch_factor, use pin_memory, and check that host's storage or "
            "network reads and CPU load."
        )
    else:
        advice = (
            "Every rank waits for data: raise DataLoader num_workers / prefetch_factor, move "
            "decoding / augmentation off the critical path, or read from faster storage."
        )
    return [
        Diagnosis(
            cause=DATA_LOADER,
            share=share,
            confidence=clip01(0.5 + 0.5 * covered / total),
            evidence=evidence,
            recommendation=advice,
            workers=tuple((int(f.result.dp_ranks[d]), int(f.result.stages[s])) for d, s in named),
            ranks=tuple(r for w in named for r in f.ranks_of(*w)),
        )
    ]


def communication(f: Facts) -> list[Diagnosis]:
    a = f.result.attribution
    if a is None or f.excess <= 1e-12:
        return []
    share = (a.decomposition.communication - 1.0) / f.excess
    prep = f.result.prepared
    comm_types = [n for n in prep.layout.op_types if n in O.COMMUNICATION_OP_TYPES] if prep else []
    transfer = f.type_totals(*comm_types) if comm_types else None
    if share < f.config.min_share or transfer is None:
        return []
    per_worker = transfer.mean(axis=0)  # [dp, stage]
    ratio = per_worker / np.maximum(median(per_worker, axis=0, keepdims=True), 1e-12)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    # Transfers themselves must be slow: over their ideal job-wide, or on one worker against its
    # peers. Ranks waiting for a late peer do not count (waiting is not transfer).
    ideal = _ideal_transfer_per_step(f, comm_types)
    overall = float(per_worker.mean()) / ideal if ideal > 0 else 1.0
    if overall < f.config.min_transfer_ratio and ratio[worst] < 1.5:
        return []
    families = {
        g: num(v)
        for g, v in f.result.by_op_type.items()
        if g in O.COMMUNICATION_OP_TYPES or g.endswith("-pp-comm")
    }
    evidence: dict[str, Any] = {
        "communication_share": num(share),
        "transfer_over_ideal": num(overall),
        "by_op_type": dict(sorted(families.items(), key=lambda kv: -kv[1])),
        "worst_worker": {**f.worker(*worst), "transfer_ratio": num(ratio[worst])},
    }
    if f.signals.backend:
        evidence["backend"] = f.signals.backend
    if ratio[worst] >= 1.5:
        advice = f"Transfers on {f.where(*worst)} take {ratio[worst]:.1f}x the median of its stage: " + (
            _link_advice(f.signals.backend)
        )
    else:
        advice = "Collective transfer time itself is high on all ranks: " + _fabric_advice(f.signals.backend)
    return [
        Diagnosis(
            cause=COMMUNICATION,
            share=share,
            confidence=clip01(0.5 + 0.5 * share),
            evidence=evidence,
            recommendation=advice,
            ranks=f.ranks_of(*worst) if ratio[worst] >= 1.5 else (),
        )
    ]


def _ideal_transfer_per_step(f: Facts, comm_types: list[str]) -> float:
    """Transfer seconds per step per worker in the ideal world (D* of each comm slot)."""
    prep = f.result.prepared
    if prep is None:
        return 0.0
    names = np.array([prep.layout.type_name(j) for j in range(prep.layout.n_slots)], dtype=object)
    slots = np.isin(names, comm_types)
    return float(prep.durations.ideal[slots].sum()) / max(len(f.result.stages), 1)


def _link_advice(backend: str) -> str:
    if backend == "gloo":
        return (
            "gloo moves tensors over TCP on the CPU: check that host's network interface and CPU "
            "load, and that GLOO_SOCKET_IFNAME names the fast interface."
        )
    return (
        "check its NIC / InfiniBand port (ibstat, port error counters), cabling and the NCCL "
        "topology (NCCL_DEBUG=INFO)."
    )


def _fabric_advice(backend: str) -> str:
    if backend == "gloo":
        return (
            "gloo all-reduces on the CPU over TCP, which is slow for large gradients: on GPUs use "
            "the NCCL backend; on CPUs check the network and the CPU left for gloo's threads, and "
            "overlap the gradient reduce with backward (DDP bucket_cap_mb)."
        )
    return (
        "look for fabric congestion or jobs sharing the network, check NCCL settings (NCCL_ALGO, "
        "NCCL_BUFFSIZE), and overlap the gradient reduce with the backward pass (bucketed / "
        "overlapped grad reduce)."
    )


def checkpoint_io(f: Facts) -> list[Diagnosis]:
    grid = f.steps_grid
    if grid is None:
        return []
    names = [n for n in set(grid[2].tolist()) if any(w in str(n).lower() for w in CHECKPOINT_WORDS)]
    spans = f.type_totals(*names) if names else None
    if spans is None:
        return []
    per_step = spans.max(axis=(1, 2))
    everyone = (spans > 0).all(axis=(1, 2))
    at = f.result.steps[everyone]
    if at.size < 2:
        return []
    gaps = np.diff(at)
    interval = most_common(gaps)
    regular = float((gaps == interval).mean())
    time_share = float(per_step.sum() / max(float(f.result.trace_step_time.sum()), 1e-12))
    if time_share < 0.01:
        return []
    evidence: dict[str, Any] = {
        "interval_steps": interval,
        "checkpoints": int(at.size),
        "mean_seconds": num(float(per_step[everyone].mean())),
        "time_share": num(time_share),
        "regularity": num(regular),
    }
    return [
        Diagnosis(
            cause=CHECKPOINT_IO,
            share=time_share,
            confidence=clip01(0.4 + 0.6 * regular),
            evidence=evidence,
            recommendation=(
                f"Checkpoints every {interval} steps stop all ranks for {evidence['mean_seconds']} s "
                f"({time_share:.1%} of step time): save asynchronously (torch.distributed.checkpoint "
                "async_save, Megatron --async-save), stage to local NVMe first, or checkpoint less often."
            ),
        )
    ]
