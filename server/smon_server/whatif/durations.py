"""Measured durations D (compute time, or transfer time for communication) and idealised D*.

A communication op's recorded duration mixes moving bytes with waiting for the slowest peer;
only the transfer part belongs to the op (`transfer_i = end_i - max_{j in G} start_j`, at least
0). The waiting part is re-created by the replay from whoever is late, so a slow worker's delay
shows up where it is caused, not in every peer's collective.

D*: per op type, over every instance in the window: compute -> the mean (over all stages too,
which is what models a balanced partition), communication -> the median transfer time.
That is the paper's estimator. On a small job the mean keeps much of a straggler inside the ideal
(2 workers: half of it), so the `robust` estimator first leaves out the workers that stand out from
their stage's DP peers in that op type (per-worker mean above the peers' typical one by more than a
tolerance), then takes the same mean over the rest: a slow rank, its slow data loader, its GC
pauses or rank 0's evaluation are not part of the ideal, while work every worker does (and stage
imbalance, since stages are never compared with each other) stays in it. Communication takes the
plain mean of transfer times over every instance (not the paper's median): transfers on a busy
fabric or a shared host are heavy-tailed, and a median below the typical cost blamed every rank
of healthy jobs for the ordinary tail; which end of a collective sees the longer transfer is an
artifact of where it is timed, so no worker is left out either. A worker whose transfers stand
out is named by the communication rule (its transfers against its stage's median). Absent
instances (a `gc` op on steps without a collection) count as zero-cost compute instances, so D* of
an occasional phase is its average cost per step; absent communication instances are left out of
the median. One D* per op type makes the ideal step identical on every step and DP replica.

Ordinary jitter (robust estimator only). A job without stragglers still jitters: every step waits
for whichever rank happened to be slowest, so a jitter-free ideal makes even a healthy job look
straggling (2 ranks on a shared CPU: S 1.07-1.12 from jitter alone), and overstates what removing
a straggler would buy, since the same job without it still jitters. So the robust estimator also
returns a *jitter allowance*: per instance that ran, its deviation from its worker's own mean in
that slot (over the instances that ran: an op present on some steps only is a pattern, not noise),
clipped to +-`jitter_sigmas` robust sigmas of those deviations over the stage's kept workers. The
healthy ideal is D* plus that allowance (sources.JitterSource): a worker's bias over its peers is
never in it, nor is anything beyond the envelope (a GC pause, an evaluation step, a long batch).
A left-out worker keeps its jitter too, within its peers' envelope: the same job without the
straggler still has a rank there, jittering like the others. Op types whose recorded sequence
lengths vary get no allowance: there the variation is sequence imbalance, which balancing
removes, not noise.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

import numpy as np

from smon_server.whatif.graph import StepGraph
from smon_server.whatif.layout import StepLayout
from smon_server.whatif.robust import beyond_noise, lower_median_index, median, robust_sigma


@dataclass(frozen=True)
class Durations:
    measured: np.ndarray  # [n_slots, n_steps, n_dp]: compute duration / comm transfer
    ideal: np.ndarray  # [n_slots] D* of each slot's op type
    ideal_by_type: dict[str, float]
    trace_step_time: np.ndarray  # [n_steps]: latest end - earliest start, as recorded
    # robust estimator: per op type, the workers (dp index, stage index) left out of its D*
    left_out: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    jitter: Jitter | None = None  # robust estimator: the healthy-jitter allowance


@dataclass(frozen=True)
class Jitter:
    """Per slot and DP replica: an instance that ran (d > 0) keeps clip(d - mean, -cap, cap)."""

    mean: np.ndarray  # [n_slots, n_dp] each worker's mean in the slot over the instances that ran
    cap: np.ndarray  # [n_slots] jitter_sigmas x robust sigma of the kept workers' deviations


# Below this a per-worker difference in an op type's time is noise whatever its ratio (seconds).
ABSOLUTE_TOLERANCE = 50e-6
# A jitter sigma is a median over at most this many instances, drawn at random (a fixed seed: the
# same window gives the same sigma). Against the sigma of all 32,000 of a 64-rank x 500-step op
# type it differs by 2% (sd over 20 random blocks, 3.7% at most); those medians were about a
# quarter of a small job's engine time in a pass.
SIGMA_SAMPLE = 8192


def measure(
    layout: StepLayout,
    graph: StepGraph,
    *,
    release_start: bool = True,
    estimator: str = "paper",
    outlier_tolerance: float = 0.10,
    jitter_sigmas: float = 3.0,
    length_driven: frozenset[str] = frozenset(),
    host_floor: dict[str, float] | None = None,
) -> Durations:
    """Transfer times, trace step times and D*. With `release_start` the layout's start array is
    dropped afterwards (the replay never needs it; on large jobs it is a third of the memory).
    `host_floor` bounds a compute op type's D* from below by the time the host takes to issue it
    (batches.host_floors): a device-bound rank's kernels alone are not a step any rank can run."""
    start, duration, present = layout.start, layout.duration, layout.present
    trace_step_time = trace_times(start, duration)
    measured = transfers_in_place(start, duration, present, graph)
    if release_start:
        layout.start = np.empty((0, 0, 0))
        layout.present = np.empty((0, 0, 0), dtype=bool)
    return ideal_durations(
        layout,
        graph,
        measured,
        present,
        trace_step_time,
        estimator=estimator,
        outlier_tolerance=outlier_tolerance,
        jitter_sigmas=jitter_sigmas,
        length_driven=length_driven,
        host_floor=host_floor,
    )


def trace_times(start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """[n_steps]: latest end - earliest start of each step, as recorded."""
    n_slots, n_steps, _ = start.shape
    first = np.full(n_steps, np.inf, dtype=start.dtype)
    last = np.full(n_steps, -np.inf, dtype=start.dtype)
    # A block of slots none of which ran on some step (a job whose steps differ) is all NaN there.
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for lo in range(0, n_slots, 64):  # bounded temporaries on large jobs
            s, d = start[lo : lo + 64], duration[lo : lo + 64]
            first = np.fmin(first, np.nanmin(s, axis=(0, 2)))
            last = np.fmax(last, np.nanmax(s + d, axis=(0, 2)))
    return np.asarray(last.astype(np.float64) - first)


def transfers_in_place(
    start: np.ndarray, duration: np.ndarray, present: np.ndarray, graph: StepGraph
) -> np.ndarray:
    """`duration` with each communication slot's recorded duration replaced by its transfer
    time (step by step: each step's transfers are its own)."""
    measured = duration  # transfers overwrite the comm slots in place
    for members, spans in zip(graph.groups, graph.group_spans_dp, strict=True):
        idx = list(members)
        member_start = start[idx]  # [k, steps, dp]
        complete = bool(present[idx].all())
        if complete:
            latest = member_start.max(axis=0)
            if spans:
                latest = latest.max(axis=1, keepdims=True)
            transfer = member_start + duration[idx]
            transfer -= latest
            np.maximum(transfer, 0.0, out=transfer)
        else:
            latest = np.fmax.reduce(member_start, axis=0)
            if spans:
                latest = np.fmax.reduce(latest, axis=1, keepdims=True)
            transfer = member_start + duration[idx] - latest
            transfer = np.where(np.isnan(transfer), 0, np.maximum(transfer, 0))
        measured[idx] = transfer
    return measured


def ideal_durations(
    layout: StepLayout,
    graph: StepGraph,
    measured: np.ndarray,
    present: np.ndarray,
    trace_step_time: np.ndarray,
    *,
    estimator: str = "paper",
    outlier_tolerance: float = 0.10,
    jitter_sigmas: float = 3.0,
    length_driven: frozenset[str] = frozenset(),
    host_floor: dict[str, float] | None = None,
) -> Durations:
    """D* and the jitter allowance of the whole window, from its measured durations."""
    ideal_by_type: dict[str, float] = {}
    left_out: dict[str, list[tuple[int, int]]] = {}
    ideal = np.zeros(layout.n_slots)
    for code in np.unique(layout.slot_type):
        slots = np.flatnonzero(layout.slot_type == code)
        name = layout.op_types[int(code)]
        values = measured[slots]
        if estimator == "robust" and graph.is_comm[slots[0]]:
            value = float(values.mean(dtype=np.float64))  # every transfer's ordinary tail stays
        elif estimator == "robust":
            value, out = _robust_mean(values, layout.slot_stage[slots], outlier_tolerance)
            if out:
                left_out[name] = out
        elif graph.is_comm[slots[0]]:
            chosen = values[present[slots]]
            value = float(median(chosen)) if chosen.size else 0.0
        else:
            value = float(values.mean(dtype=np.float64))
        if host_floor and name in host_floor and not graph.is_comm[slots[0]]:
            value = max(value, host_floor[name])
        ideal_by_type[name] = value
        ideal[slots] = value
    jitter = None
    if estimator == "robust" and jitter_sigmas > 0:
        jitter = _jitter(layout, measured, left_out, jitter_sigmas, length_driven)
    return Durations(
        measured=measured,
        ideal=ideal,
        ideal_by_type=ideal_by_type,
        trace_step_time=trace_step_time,
        left_out=left_out,
        jitter=jitter,
    )


def _jitter(
    layout: StepLayout,
    measured: np.ndarray,
    left_out: dict[str, list[tuple[int, int]]],
    sigmas: float,
    length_driven: frozenset[str],
) -> Jitter:
    # Over the instances that ran: an op present on some steps only (a GC pause every few steps,
    # an evaluation) is a pattern to idealise, not jitter; only how long it takes when it runs is.
    ran = measured > 0
    count = ran.sum(axis=1)
    mean = np.divide(
        measured.sum(axis=1, dtype=np.float64), count, out=np.zeros(count.shape), where=count > 0
    )
    kept = np.ones(mean.shape, dtype=bool)  # the envelope is the kept workers' jitter
    for name, workers in left_out.items():
        code = layout.op_types.index(name)
        for d, stage in workers:
            kept[(layout.slot_type == code) & (layout.slot_stage == stage), d] = False
    cap = np.zeros(layout.n_slots)
    for code in np.unique(layout.slot_type):
        if layout.op_types[int(code)] in length_driven:
            continue
        for stage in np.unique(layout.slot_stage):
            slots = np.flatnonzero((layout.slot_type == code) & (layout.slot_stage == stage))
            cols = np.flatnonzero(kept[slots].all(axis=0))
            if not slots.size or not cols.size:
                continue
            deviation = _deviations(measured, mean, ran, slots, cols)
            if deviation.size:
                cap[slots] = sigmas * float(robust_sigma(deviation))
    return Jitter(mean=mean.astype(measured.dtype), cap=cap)


def _deviations(
    measured: np.ndarray, mean: np.ndarray, ran: np.ndarray, slots: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """The deviations from their worker's mean of the instances that ran in `slots` x `cols`
    (DP replicas), or of at most ~SIGMA_SAMPLE of them drawn at random: the whole block is built
    only when it is small (a 16,384-rank window's is tens of millions of instances)."""
    shape = (slots.size, measured.shape[1], cols.size)
    total = shape[0] * shape[1] * shape[2]
    if total <= 2 * SIGMA_SAMPLE:
        return _every_deviation(measured, mean, ran, slots, cols)
    k, step, c = _drawn(shape)
    n_dp = measured.shape[2]
    cell = slots[k] * n_dp + cols[c]  # flat [slot, dp] of each drawn instance, in `mean`
    at = (slots[k] * shape[1] + step) * n_dp + cols[c]  # flat [slot, step, dp], in `measured`
    values = np.ravel(measured)[at]
    did = np.ravel(ran)[at]
    if did.sum() < SIGMA_SAMPLE // 8:  # an op type that runs on few steps: drawn from those that ran
        every = _every_deviation(measured, mean, ran, slots, cols)
        if every.size <= SIGMA_SAMPLE:
            return every
        rng = np.random.default_rng(total)
        rng.integers(0, total, SIGMA_SAMPLE)  # the draws above, then the same second draw as ever
        return every[rng.integers(0, every.size, SIGMA_SAMPLE)]
    return values[did] - np.ravel(mean)[cell[did]]


@functools.lru_cache(maxsize=64)
def _drawn(shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot, step, column) within a block of `shape` of the instances it draws, seeded by its
    size (a window's sigma does not change from run to run), in the order they lie in memory:
    a median does not care, and a gather in address order is quicker than one at random. Kept:
    every op type of every job of one shape draws the same ones (making them was a third of
    each sigma's time)."""
    total = shape[0] * shape[1] * shape[2]
    drawn = np.sort(np.random.default_rng(total).integers(0, total, SIGMA_SAMPLE))
    row, c = np.divmod(drawn, shape[2])
    k, step = np.divmod(row, shape[1])
    for a in (k, step, c):
        a.flags.writeable = False
    return k, step, c


def _every_deviation(
    measured: np.ndarray, mean: np.ndarray, ran: np.ndarray, slots: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    block = np.ix_(slots, np.arange(measured.shape[1]), cols)
    return (measured[block] - mean[slots][:, None, cols])[ran[block]]


def _robust_mean(
    values: np.ndarray, slot_stage: np.ndarray, tolerance: float
) -> tuple[float, list[tuple[int, int]]]:
    """Mean over the instances of the workers that do not stand out in this op type.

    `values` is [k slots, steps, dp] of one op type. Per stage, each DP worker's cost per step is
    compared with the *lower* median of its peers (for 2 workers: the faster one, so a straggler
    cannot hide in the reference); a worker more than max(tolerance x reference, 3 robust sigmas,
    50 µs) above it, and beyond noise against that reference worker (robust.beyond_noise), is
    left out. Workers with no instance of the op type at all are peers at zero
    cost (rank 0's evaluation: the others do none), as in the paper's mean."""
    total, count = 0.0, 0
    left_out: list[tuple[int, int]] = []
    for stage in np.unique(slot_stage):
        rows = slot_stage == stage
        block = values[rows]  # [k, steps, dp]
        step_cost = block.sum(axis=0, dtype=np.float64)  # [steps, dp]
        per_worker = step_cost.mean(axis=0)  # [dp]: cost per step
        keep = np.ones(per_worker.shape[0], dtype=bool)
        peers = np.sort(per_worker)  # a worker without the op type is a zero-cost peer
        if peers.size >= 2:
            ref_worker = lower_median_index(per_worker)
            reference = float(per_worker[ref_worker])
            spread = float(robust_sigma(peers)) if peers.size >= 5 else 0.0
            limit = reference + max(tolerance * reference, 3.0 * spread, ABSOLUTE_TOLERANCE)
            # ... and beyond noise against the reference worker (robust.beyond_noise): heavy
            # tails of a shared host (a transfer now and then 4x its median) are not a straggler,
            # a data wait on every other step is.
            keep = per_worker <= limit
            over = np.flatnonzero(~keep)
            if over.size:
                keep[over] = ~beyond_noise(step_cost, ref_worker, over, per_worker[over] - reference)
            left_out.extend((int(d), int(stage)) for d in np.flatnonzero(~keep))
        total += float(block[:, :, keep].sum(dtype=np.float64))
        count += int(block.shape[0] * block.shape[1] * int(keep.sum()))
    return (total / count if count else 0.0), left_out
