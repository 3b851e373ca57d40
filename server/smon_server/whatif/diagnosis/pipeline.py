"""stage_imbalance and sequence_imbalance: compute that differs by stage, or by micro-batch.

stage_imbalance. Share: the *stage* part of the excess (compute at each stage's typical time:
the median over DP ranks, so one slow worker does not make its stage look heavy). Named when one
stage's typical compute stands above the mean stage; consistency over steps gives confidence.

sequence_imbalance. Share: the *transient* part (all measured compute over each worker's mean:
what varies from micro-batch to micro-batch and step to step). Named
- with sequence lengths (`seq_sq` = Σ len² per micro-batch): when compute tracks Σ len²
  (correlation >= 0.9) and the per-step slowest worker moves between steps (DESIGN §5);
- without: when one op type's compute varies strongly within workers (CV >= 0.1, far above
  kernel noise) but not between them, and the per-step slowest worker moves between steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.diagnosis.base import (
    SEQUENCE_IMBALANCE,
    STAGE_IMBALANCE,
    Diagnosis,
    Facts,
    clip01,
    num,
)
from smon_server.whatif.robust import median

HEAVY = 1.05  # a stage 5% above the mean stage is a partitioning problem worth moving layers for
MODEL_COMPUTE = (O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE)


def stage_imbalance(f: Facts) -> list[Diagnosis]:
    a = f.result.attribution
    share = f.shares.get("stage", 0.0)
    stages = f.result.stages
    if a is None or len(stages) < 2 or share < f.config.min_share:
        return []
    compute = f.type_totals(*MODEL_COMPUTE)
    if compute is None:
        return []
    typical = median(compute, axis=1)  # [step, stage]
    mean_typical = typical.mean(axis=0)
    ratio = mean_typical / max(float(mean_typical.mean()), 1e-12)
    worst, lightest = int(ratio.argmax()), int(ratio.argmin())
    consistency = float((typical.argmax(axis=1) == worst).mean())
    evidence: dict[str, Any] = {
        "stage": int(stages[worst]),
        "compute_ratio": num(ratio[worst]),
        "per_stage_compute_ratio": {str(int(s)): num(r) for s, r in zip(stages, ratio, strict=True)},
        "per_stage_slowdown": {str(int(s)): num(v) for s, v in zip(stages, a.stage, strict=True)},
        "heaviest_in_steps": num(consistency),
        "stage_share": num(share),
        "m_s": num(a.m_s),
    }
    move = 1.0 - 1.0 / ratio[worst]
    where = "last" if worst == len(stages) - 1 else ("first" if worst == 0 else "")
    extra = {
        "last": " The last stage also runs the output layer and the loss: give it fewer transformer "
        "layers (e.g. Megatron --decoder-last-pipeline-num-layers).",
        "first": " The first stage also runs the embedding: give it fewer transformer layers "
        "(e.g. Megatron --decoder-first-pipeline-num-layers).",
        "": "",
    }[where]
    recommendation = (
        f"Stage {int(stages[worst])} computes {ratio[worst]:.2f}x the mean stage on "
        f"{consistency:.0%} of steps: move about {move:.0%} of its work to the lighter stages "
        f"(K ≈ round({move:.2f} x its layer count) layers), starting with stage "
        f"{int(stages[lightest])} ({ratio[lightest]:.2f}x).{extra}"
    )
    confidence = clip01(0.5 + 0.5 * consistency) if ratio[worst] >= HEAVY else 0.4
    return [
        Diagnosis(
            cause=STAGE_IMBALANCE,
            share=share,
            confidence=confidence,
            evidence=evidence,
            recommendation=recommendation,
        )
    ]


def sequence_imbalance(f: Facts) -> list[Diagnosis]:
    a = f.result.attribution
    share = f.shares.get("transient", 0.0)
    grid = f.steps_grid
    if a is None or grid is None or share < f.config.min_share:
        return []
    measured, slot_stage, names = grid
    within, between = [], []
    for s in range(len(f.result.stages)):
        for name in MODEL_COMPUTE:
            v = measured[(slot_stage == s) & (names == name)]  # [instance, step, dp]
            if v.size == 0:
                continue
            per_worker = v.reshape(-1, v.shape[2]).astype(np.float64)
            mean = per_worker.mean(axis=0)
            within.append(float(np.mean(per_worker.std(axis=0) / np.maximum(mean, 1e-12))))
            between.append(float(mean.std() / max(float(mean.mean()), 1e-12)))
    if not within:
        return []
    k = int(np.argmax(within))
    cv_within, cv_between = within[k], between[k]
    per_step = a.worker_step.reshape(-1, a.worker_step.shape[2])
    worst = np.where(np.isnan(per_step), -np.inf, per_step).argmax(axis=0)  # NaN: missing worker
    n_steps = worst.shape[0]
    persistence = float(np.bincount(worst).max() / n_steps)
    # Which DP replica holds the slowest worker: a persistent straggler keeps it near 1, a random
    # one near 1 / dp. "Moving" is below the midpoint (never stricter than `mobile_worst`), so
    # two replicas, where chance alone gives 0.5, can still show it.
    n_dp = a.worker_step.shape[0]
    dp_persistence = float(np.bincount(worst // a.worker_step.shape[1]).max() / n_steps)
    threshold = max(f.config.mobile_worst, (1.0 + 1.0 / max(n_dp, 1)) / 2.0)
    moving = n_steps >= 3 and n_dp >= 2 and dp_persistence < threshold
    varying = cv_within >= f.config.microbatch_cv and cv_between < cv_within
    evidence: dict[str, Any] = {
        "transient_share": num(share),
        "microbatch_cv": num(cv_within),
        "worker_cv": num(cv_between),
        "slowest_worker_persistence": num(persistence),
        "slowest_replica_persistence": num(dp_persistence),
        "distinct_slowest_workers": len(np.unique(worst)),
    }
    corr = _length_correlation(f)
    if corr is not None:
        evidence["seq_sq_correlation"] = num(corr)
        if corr < f.config.seq_correlation or (n_steps >= 3 and not moving):
            return []  # lengths do not explain it, or one worker is slowest every time
        confidence = clip01(0.75 + 0.25 * varying) if n_steps >= 3 else 0.5
        lengths = "Micro-batch compute tracks Σ len² of its sequences"
    elif moving and varying and not f.table.ends_at_last_op:
        # Timing alone, for traces (which carry no lengths). Live agents read lengths wherever
        # they are visible; without them, time-slicing on a shared host looks just like this.
        confidence = 0.6
        lengths = (
            "Micro-batch compute varies widely with no persistent per-worker pattern (sequence "
            "lengths not recorded: confirm with mon.record_batch(seq_lens=...))"
        )
    else:
        return []
    return [
        Diagnosis(
            cause=SEQUENCE_IMBALANCE,
            share=share,
            confidence=confidence,
            evidence=evidence,
            recommendation=(
                f"{lengths}{', and the slowest worker moves from step to step' if moving else ''}. "
                "Balance micro-batches "
                "by Σ len² (attention cost), not by token count: sort or bucket samples by length "
                "and pack each micro-batch (and each DP rank's share of the global batch) to a "
                "similar Σ len²."
            ),
        )
    ]


def _length_correlation(f: Facts) -> float | None:
    """Pearson r of compute duration on Σ len², per (stage, op type), weighted by op count."""
    t = f.table
    if t.seq_sq.shape[0] != len(t):
        return None
    codes = [t.code(n) for n in MODEL_COMPUTE]
    rows = np.flatnonzero(np.isfinite(t.seq_sq) & np.isin(t.op_type, codes))
    if rows.size < 3:
        return None
    stage, op_type, seq_sq, duration = t.stage[rows], t.op_type[rows], t.seq_sq[rows], t.duration[rows]
    total, weight = 0.0, 0
    constant = True
    for s in np.unique(stage):
        for code in codes:
            m = (stage == s) & (op_type == code)
            x, y = seq_sq[m], duration[m]
            constant &= bool(x.size == 0 or x.std() == 0)
            if x.size < 3 or x.std() == 0 or y.std() == 0:
                continue
            total += float(np.corrcoef(x, y)[0, 1]) * x.size
            weight += x.size
    if constant:
        return 0.0  # lengths were recorded and never vary: they cannot explain anything
    return total / weight if weight else None
