"""Add-back attribution S_X, the worker grid S_w, and the removal metrics M_W / M_S (DESIGN §5).

Add-back: start from D*, restore the measured durations of slice X only, `S_X = T(X) / T(D*)`, for
X = one op type (the four p2p kinds fold into forward- / backward-pp-comm), one DP rank, one
stage, overall (means over steps) and per step. Removal: `M(X) = (T(D) - T(D with X idealised))
/ (T(D) - T(D*))`, with X = every op of the top ceil(3%) of workers by S_w (M_W) or every op on
the last stage (M_S).

Decomposition (docs/analysis.md): the excess S - 1 splits, by construction, into
- stage: forward / backward compute set to each stage's typical per-op time (the median over DP
  ranks of each worker's mean), everything else at D*;
- worker: compute at each worker's own mean, minus the stage part (persistent per-worker speed);
- transient: all measured compute, minus the worker part (micro-batch / step variation: sequence
  lengths, jitter);
- rest: everything but forward / backward compute (communication, gc, data wait, ...).
The four parts sum to S - 1; diagnosis turns them into causes.

Under the robust estimator (a jitter allowance present) a DP rank's add-back is set against the
same rank at its healthy durations, D* plus its own ordinary jitter plus what its DP peers lost
on the same step (sources.ReplicaJitterSource, batches.shared_deviation), rather than against the
jitter-free T(D*): `S_dp = T(D*, rank measured) / T(D*, rank healthy)`. A rank that only waits
for a straggler jitters like every rank and stalls when the whole machine does; against a
jitter-free reference that alone read S_w 1.10-1.15 on a shared CPU, beside the straggler's 1.3.

The op-type, stage, M_S and family variants run as one batch of restore masks; DP ranks run in the
two-replica form (sources.ReplicaSource); M_W needs S_w first, so it runs last.
"""

from __future__ import annotations

import math

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.batches import Prepared, replay_by_replica, replay_restored
from smon_server.whatif.ops import p2p_family
from smon_server.whatif.replay import run
from smon_server.whatif.result import Attribution, Decomposition
from smon_server.whatif.robust import median
from smon_server.whatif.sources import IdealSource, MaskedSource

MODEL_COMPUTE = (O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE)


def attribute(prep: Prepared, step_time: np.ndarray, ideal: float, top_fraction: float) -> Attribution:
    layout = prep.layout
    n_slots, _, n_dp = prep.shape
    n_stages = len(layout.stages)
    slot_group = [p2p_family(layout.type_name(j)) for j in range(n_slots)]
    op_groups = tuple(sorted(set(slot_group)))
    group_index = np.array([op_groups.index(g) for g in slot_group], dtype=np.intp)
    last_stage = layout.slot_stage == n_stages - 1
    compute = np.isin([layout.type_name(j) for j in range(n_slots)], MODEL_COMPUTE)

    # One batch: each op type restored, each stage restored, everything but the last stage, all
    # model compute, all communication.
    by_type = group_index[None, :] == np.arange(len(op_groups))[:, None]
    by_stage = layout.slot_stage[None, :] == np.arange(n_stages)[:, None]
    families = np.stack([~last_stage, compute, prep.graph.is_comm])
    restore = np.concatenate([by_type, by_stage, families])
    # Variants that restore the same slots are replayed once (one stage: the stage's variant is
    # every slot; one communication op type: it is the communication family). Each variant's
    # replay is its own; only a batch split into chunks (large jobs) can round a slot restored
    # in a whole chunk differently, in the last bit (sources.MaskedSource).
    # Two are known without a replay: everything restored is T(D) (`step_time`), nothing restored
    # is T(D*) on every step (with one stage: that stage's variant, and "all but the last").
    unique, which = np.unique(restore, axis=0, return_inverse=True)
    every, none = unique.all(axis=1), ~unique.any(axis=1)
    replayed = ~(every | none)
    times = np.empty((unique.shape[0], step_time.shape[0]), dtype=step_time.dtype)
    if replayed.any():
        times[replayed] = replay_restored(prep, np.repeat(unique[replayed][:, :, None], n_dp, axis=2))
    times[every], times[none] = step_time, ideal
    times = times[which.ravel()]
    t_type = times[: len(op_groups)]
    t_stage = times[len(op_groups) : len(op_groups) + n_stages]
    t_remove_last, t_compute, t_comm = times[-3], times[-2], times[-1]

    # Restoring the only replica restores everything.
    t_dp = replay_by_replica(prep) if n_dp > 1 else step_time[None, :].copy()
    # Each rank's add-back is set against the same rank at its healthy durations where the robust
    # estimator gives a jitter allowance (else against T(D*)): a rank that only waits for a
    # straggler is not blamed for its own ordinary jitter, nor for steps every rank lost.
    t_dp_ref: np.ndarray | float = ideal
    if n_dp > 1 and prep.durations.jitter is not None:
        t_dp_ref = replay_by_replica(prep, healthy=True)

    def overall(t: np.ndarray) -> np.ndarray:
        return t.mean(axis=1) / ideal

    s_dp, s_stage = _ratio_of_means(t_dp, t_dp_ref), overall(t_stage)
    dp_step = t_dp / t_dp_ref
    worker = np.minimum(s_dp[:, None], s_stage[None, :])
    worker_step = np.minimum(dp_step[:, None, :], (t_stage / ideal)[None, :, :])
    seen = layout.ranks >= 0
    if not seen.all() and (layout.ranks != -1).any():
        worker = np.where(seen, worker, np.nan)
        worker_step = np.where(seen[:, :, None], worker_step, np.nan)

    top = top_workers(worker, top_fraction)
    top_mask = np.zeros((n_dp, n_stages), dtype=bool)
    for d, s in top:
        top_mask[d, s] = True
    in_top = top_mask[:, layout.slot_stage].T  # [slot, dp]
    t_top = replay_restored(prep, np.stack([~in_top, in_top]))

    base = float(step_time.mean())
    gap = base - ideal
    if gap <= 1e-12 * ideal:  # no slowdown to explain: the metrics are undefined
        gap = 0.0

    def removal(t: np.ndarray) -> float:
        return (base - float(t.mean())) / gap if gap > 0 else math.nan

    def addition(t: np.ndarray) -> float:
        return (float(t.mean()) - ideal) / gap if gap > 0 else math.nan

    return Attribution(
        op_groups=op_groups,
        op_type=overall(t_type),
        op_type_step=t_type / ideal,
        dp=s_dp,
        dp_step=dp_step,
        stage=s_stage,
        stage_step=t_stage / ideal,
        worker=worker,
        worker_step=worker_step,
        top_workers=tuple((int(layout.dp_ranks[d]), int(layout.stages[s])) for d, s in top),
        m_w=removal(t_top[0]),
        m_s=removal(t_remove_last),
        m_w_add=addition(t_top[1]),
        m_s_add=addition(t_stage[-1]),
        decomposition=_decompose(prep, compute, ideal, base, float(t_compute.mean()), float(t_comm.mean())),
    )


def _ratio_of_means(t: np.ndarray, reference: np.ndarray | float) -> np.ndarray:
    """Per row of `t` [variant, step]: mean step time over the reference's (a scalar, or the
    same shape as `t`)."""
    ref = reference.mean(axis=1) if isinstance(reference, np.ndarray) else np.full(t.shape[0], reference)
    return np.asarray(np.divide(t.mean(axis=1), ref, out=np.ones(t.shape[0]), where=ref > 0))


def _decompose(
    prep: Prepared, compute: np.ndarray, ideal: float, base: float, t_compute: float, t_comm: float
) -> Decomposition:
    """Stage / worker / transient / rest parts of the excess, from two extra step-free replays."""
    layout, measured = prep.layout, prep.durations.measured
    n_slots, _, n_dp = prep.shape
    worker_profile = np.repeat(prep.durations.ideal[:, None, None], n_dp, axis=2)
    stage_profile = prep.durations.ideal.copy()
    keys = np.stack([layout.slot_stage, layout.slot_type, layout.slot_chunk], axis=1)[compute]
    slots = np.flatnonzero(compute)
    for key in np.unique(keys, axis=0):
        same = slots[(keys == key).all(axis=1)]
        per_worker = measured[same].mean(axis=(0, 1), dtype=np.float64)  # [dp]
        worker_profile[same] = per_worker[None, None, :]
        stage_profile[same] = float(median(per_worker))
    t_stage = float(run(prep.program, IdealSource(stage_profile), (1, 1, 1), 2, np.float64)[0, 0])
    src = MaskedSource(
        worker_profile.astype(measured.dtype), prep.durations.ideal, np.ones((1, n_slots, n_dp), bool)
    )
    t_worker = float(run(prep.program, src, (1, 1, n_dp), 2, np.float64)[0, 0])
    return Decomposition(
        slowdown=base / ideal,
        stage=t_stage / ideal,
        worker=t_worker / ideal,
        compute=t_compute / ideal,
        communication=t_comm / ideal,
    )


def top_workers(worker: np.ndarray, fraction: float) -> list[tuple[int, int]]:
    """Indices (dp, stage) of the ceil(fraction x workers) largest S_w, worst first; ties keep
    grid order so the choice is deterministic."""
    valid = ~np.isnan(worker)
    k = max(1, math.ceil(fraction * int(valid.sum())))
    flat = np.where(valid, worker, -np.inf).ravel()
    order = np.argsort(-flat, kind="stable")[:k]
    n_stages = worker.shape[1]
    return [(int(i) // n_stages, int(i) % n_stages) for i in order]
