"""slow_worker and gpu_throttling: one or a few workers persistently slower than their stage peers.

Share: the *worker* part of the excess (compute at each worker's own mean over compute at its
stage's typical time). The workers named are those whose compute per step stands out from the
median of their stage; M_W (how much idealising the top 3% of workers removes) and how often the
named worker is the slowest of a step give the confidence. A named worker whose GPU reports
throttling, a low SM clock or ECC / XID errors is `gpu_throttling` instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.diagnosis.base import (
    GPU_THROTTLING,
    SLOW_WORKER,
    Diagnosis,
    Facts,
    clip01,
    num,
)
from smon_server.whatif.diagnosis.stragglers import find_stragglers
from smon_server.whatif.robust import median

OUTLIER = 1.05  # 5% slower than the stage median: well above run-to-run noise of one kernel mix


def worker_causes(f: Facts) -> list[Diagnosis]:
    a = f.result.attribution
    share = f.shares.get("worker", 0.0)
    if a is None or share < f.config.min_share:
        return []
    compute = f.type_totals(O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE)
    if compute is None:
        return []
    per_step_ratio = compute / np.maximum(median(compute, axis=1, keepdims=True), 1e-12)
    ratio = compute.mean(axis=0) / np.maximum(median(compute.mean(axis=0), axis=0), 1e-12)
    worst = float(np.nanmax(ratio))
    cut = max(OUTLIER, 1.0 + 0.5 * (worst - 1.0))
    flat = np.argsort(-ratio, axis=None, kind="stable")[: f.config.max_named_workers]
    named: list[tuple[int, int]] = []
    for k in flat:
        if ratio.flat[k] >= cut:
            d, st = np.unravel_index(int(k), ratio.shape)
            named.append((int(d), int(st)))
    # Only workers that stand out as stragglers (stragglers.py): a worker a few percent slower
    # through host jitter has compute above its stage median too, but is not a slow worker.
    standing_out = {(s.dp_index, s.stage_index) for s in find_stragglers(f)}
    named = [w for w in named if w in standing_out]
    if not named:
        return []
    # How often a named worker is the slowest of its step (persistent, not wandering).
    n_stages = ratio.shape[1]
    slowest = per_step_ratio.reshape(per_step_ratio.shape[0], -1).argmax(axis=1)
    named_flat = {d * n_stages + s for d, s in named}
    persistence = float(np.isin(slowest, list(named_flat)).mean())
    concentration = clip01(a.m_w)
    confidence = clip01(0.4 + 0.3 * concentration + 0.3 * persistence)

    sick = [w for w in named if f.unhealthy_gpus(w)]
    well = [w for w in named if w not in sick]
    weight = {w: max(float(ratio[w]) - 1.0, 0.0) for w in named}
    total = sum(weight.values()) or 1.0
    out = []
    for cause, group in ((GPU_THROTTLING, sick), (SLOW_WORKER, well)):
        if not group:
            continue
        evidence: dict[str, Any] = {
            "workers": [
                {**f.worker(*w), "compute_ratio": num(ratio[w]), "s_w": num(a.worker[w])} for w in group
            ],
            "worker_share": num(share),
            "m_w": num(a.m_w),
            "slowest_in_steps": num(persistence),
        }
        if cause == GPU_THROTTLING:
            evidence["gpu"] = {r: h for w in group for r, h in f.unhealthy_gpus(w).items()}
        group_share = share * sum(weight[w] for w in group) / total
        ranks = tuple(r for w in group for r in f.ranks_of(*w))
        out.append(
            Diagnosis(
                cause=cause,
                share=group_share,
                confidence=clip01(confidence + (0.1 if cause == GPU_THROTTLING else 0.0)),
                evidence=evidence,
                recommendation=_advice(f, cause, group, ratio, persistence),
                workers=tuple((int(f.result.dp_ranks[d]), int(f.result.stages[s])) for d, s in group),
                ranks=ranks,
            )
        )
    return out


def _advice(f: Facts, cause: str, group: list[tuple[int, int]], ratio: np.ndarray, persistence: float) -> str:
    first = group[0]
    who = f.where(*first) + (f" and {len(group) - 1} more" if len(group) > 1 else "")
    slow = f"computes {ratio[first]:.2f}x slower than its stage peers"
    if cause == GPU_THROTTLING:
        health = f.unhealthy_gpus(first)
        h = next(iter(health.values()), {})
        parts = []
        if h.get("throttled_fraction", 0) >= 0.05:
            parts.append(f"throttle bits in {h['throttled_fraction']:.0%} of samples")
        if h.get("sm_clock_ratio") is not None and h["sm_clock_ratio"] <= 0.9:
            parts.append(f"SM clock at {h['sm_clock_ratio']:.0%} of max")
        if h.get("ecc_uncorrected") or h.get("xid_events"):
            parts.append(f"{h['ecc_uncorrected']} ECC / {h['xid_events']} XID errors")
        return (
            f"{who} {slow}; its GPU reports {', '.join(parts)}. Check cooling and power capping "
            "(nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE); with ECC / XID errors drain the "
            "node and have the GPU replaced, then restart the job without it."
        )
    known = all(r in f.signals.gpu for w in group for r in f.ranks_of(*w))
    gpu = (
        "while its GPU reports no throttling or errors"
        if known
        else "(no GPU health for it here: check nvidia-smi -q -d PERFORMANCE,CLOCK,ECC)"
    )
    return (
        f"{who} {slow} (slowest on {persistence:.0%} of steps) {gpu}. Look at that host for CPU "
        "or PCIe contention, other processes, or a degraded NVLink (nvidia-smi topo -m, top); if "
        "it persists, cordon the host and restart the job without it."
    )
