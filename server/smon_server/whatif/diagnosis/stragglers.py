"""Which workers are stragglers, and each one's own cause and evidence.

A worker is a straggler when restoring its measured durations alone makes the ideal job straggle
(`S_w` at or above the straggling threshold) *and* it stands out from its DP peers of the same
stage: its own busy time per step (every op, transfers without the waiting) exceeds the peers'
typical worker's (the lower median: for two workers, the faster one) by at least `min_standout`
of the ideal step (the same 10% that makes a job straggling, so a worker is blamed only for
what could make the job straggle on its own) and beyond noise against that worker
(robust.beyond_noise: two robust sigmas of its step-to-step jitter, or three standard errors
over blocks of the window; so a rank that shares its core with something else for a while, on a
healthy job, is not blamed for the noise, while one whose data loader runs dry every other step is).
Ranks that only wait for a straggler have no such surplus (waiting is not transfer,
see durations.py), and when every worker is equally slow none stands out: that is a job-wide cause.

Each straggler's cause is read from its own surplus, not from the job's leading diagnosis: the op
type where it loses the most time to its peers names it (forward / backward compute: slow_worker,
or gpu_throttling when its GPU reports throttling or errors; data_wait: data_loader; gc:
python_gc; host and evaluation / custom phases: host_work; checkpoint phases: checkpoint_io;
transfers: communication).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.diagnosis.base import (
    CHECKPOINT_IO,
    COMMUNICATION,
    DATA_LOADER,
    GPU_THROTTLING,
    HOST_WORK,
    PYTHON_GC,
    SLOW_WORKER,
    Facts,
    most_common,
    num,
)
from smon_server.whatif.robust import beyond_noise, lower_median_index, median

COMPUTE_TYPES = frozenset({O.FORWARD_COMPUTE, O.BACKWARD_COMPUTE, O.OPTIMIZER, "h2d"})
CHECKPOINT_WORDS = ("checkpoint", "ckpt", "save")


@dataclass(frozen=True)
class Straggler:
    dp_index: int
    stage_index: int
    slowdown: float  # S_w
    cause: str
    evidence: dict[str, Any]


def cause_of(op_type: str) -> str:
    """The cause a worker's surplus in one op type points to."""
    if op_type in COMPUTE_TYPES:
        return SLOW_WORKER
    if op_type == O.DATA_WAIT:
        return DATA_LOADER
    if op_type == O.GC:
        return PYTHON_GC
    if op_type in O.COMMUNICATION_OP_TYPES:
        return COMMUNICATION
    if any(w in op_type.lower() for w in CHECKPOINT_WORDS):
        return CHECKPOINT_IO
    return HOST_WORK  # `host` itself, evaluation, and any other phase the script runs on its own


def surplus_by_type(f: Facts) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """(op type names, own seconds per step [type, dp, stage], surplus over the DP peers [same]).

    The peers' reference is the lower median over the stage's DP workers, so on two workers a
    straggler is measured against the other one rather than against the midpoint of both."""
    if "surplus" in f.cache:
        cached: tuple[list[str], np.ndarray, np.ndarray] | None = f.cache["surplus"]
        return cached
    grid = f.steps_grid
    out = None
    if grid is not None:
        names = sorted({str(n) for n in grid[2].tolist()})
        # Each type's mean over steps, then stacked: stacking the [step, dp, stage] totals first
        # copied them whole (0.25 s of a 16,384-rank pass, for a mean).
        own = np.stack([t.mean(axis=0) for t in _totals(f, names)])
        ordered = np.sort(own, axis=1)
        lower_median = ordered[:, (own.shape[1] - 1) // 2, :]  # [type, stage]
        out = (names, own, own - lower_median[:, None, :])
    f.cache["surplus"] = out
    return out


def _totals(f: Facts, names: list[str]) -> list[np.ndarray]:
    """Seconds per [step, dp, stage] of each named op type (all present in the table)."""
    return [t for t in (f.type_totals(n) for n in names) if t is not None]


def find_stragglers(f: Facts, min_standout: float = 0.10, limit: int = 16) -> list[Straggler]:
    key = f"stragglers:{min_standout}:{limit}"
    if key not in f.cache:
        f.cache[key] = _find(f, min_standout, limit)
    cached: list[Straggler] = f.cache[key]
    return cached


def _find(f: Facts, min_standout: float, limit: int) -> list[Straggler]:
    a = f.result.attribution
    found = surplus_by_type(f)
    ideal = f.result.ideal_step_time
    if a is None or found is None or ideal <= 0:
        return []
    names, own, surplus = found
    busy = own.sum(axis=0)  # [dp, stage] seconds per step
    standout = busy - np.sort(busy, axis=0)[(busy.shape[0] - 1) // 2][None, :]  # over the lower median
    s_w = np.where(np.isnan(a.worker), -np.inf, a.worker)
    candidates = (s_w >= f.result.config.straggling_threshold) & (standout >= min_standout * ideal)
    if candidates.any():
        candidates &= _beyond_noise(f, names, busy, standout, candidates)
    order = sorted(zip(*np.nonzero(candidates), strict=True), key=lambda w: -s_w[w])[:limit]
    out = []
    for d, s in order:
        w = (int(d), int(s))
        t = int(np.argmax(surplus[:, d, s]))
        op_type = names[t]
        cause = cause_of(op_type)
        gpu = f.unhealthy_gpus(w)
        if cause == SLOW_WORKER and gpu:
            cause = GPU_THROTTLING
        evidence: dict[str, Any] = {
            "s_w": num(float(s_w[w])),
            "op_type": op_type,
            "own_s_per_step": num(float(own[t, d, s])),
            "peers_s_per_step": num(float(own[t, d, s] - surplus[t, d, s])),
            "surplus_s_per_step": num(float(surplus[t, d, s])),
            "surplus_of_ideal_step": num(float(surplus[t, d, s] / ideal)),
            "total_surplus_s_per_step": num(float(standout[w])),
        }
        evidence.update(when_lost(f, [op_type], w))
        if gpu:
            evidence["gpu"] = gpu
        out.append(
            Straggler(dp_index=w[0], stage_index=w[1], slowdown=float(s_w[w]), cause=cause, evidence=evidence)
        )
    return out


def when_lost(f: Facts, op_types: list[str], w: tuple[int, ...]) -> dict[str, Any]:
    """On which steps worker `w` lost its time in `op_types` against its stage peers' median:
    every step, or some (listed, with the interval when it is periodic) and the worst loss."""
    totals = _totals(f, op_types)
    if not totals:
        return {}
    lost = np.asarray(sum(t[:, w[0], w[1]] - median(t[:, :, w[1]], axis=1) for t in totals))
    if lost.max() <= 0:
        return {}
    big = lost > 0.5 * float(lost.max())
    out: dict[str, Any] = {"steps_affected": int(big.sum()), "steps_analysed": int(lost.size)}
    if big.mean() >= 0.8:
        return {**out, "on_every_step": True}
    steps = f.result.steps[big]
    out.update(steps=[int(x) for x in steps[:20]], max_s=num(float(lost.max())))
    if steps.size >= 2:
        gaps = np.diff(steps)
        interval = most_common(gaps)
        if float((gaps == interval).mean()) >= 0.8:
            out["every_n_steps"] = interval
    return out


def _beyond_noise(
    f: Facts, names: list[str], busy: np.ndarray, standout: np.ndarray, wanted: np.ndarray
) -> np.ndarray:
    """[dp, stage]: whether each `wanted` worker's surplus of busy time stands beyond noise against
    its stage's typical worker (robust.beyond_noise; others: False). A surplus within a couple
    of step-to-step sigmas is the host's scheduling noise (one rank sharing its core with
    something else for a while, on a healthy job), unless it is there in every stretch of the
    window: a slow GPU or a sleeping rank shifts every step, a data loader that runs dry every
    other step or an evaluation every N steps shifts those steps by a lot, while noise only
    widens the spread."""
    totals = _totals(f, names)
    per_step: np.ndarray = np.sum(totals, axis=0)  # [step, dp, stage]
    out = np.zeros(busy.shape, dtype=bool)
    for s in range(busy.shape[1]):
        workers = np.flatnonzero(wanted[:, s])
        if workers.size:
            out[workers, s] = beyond_noise(
                per_step[:, :, s], lower_median_index(busy[:, s]), workers, standout[workers, s]
            )
    # ... or in the op type where it loses the most, alone: every other op type's jitter adds to
    # the busy total's, and can bury an evaluation every 20 steps that no peer runs at all.
    found = surplus_by_type(f)
    if found is not None:
        _, own, surplus = found
        for d, s in zip(*np.nonzero(wanted & ~out), strict=True):
            t = int(np.argmax(surplus[:, d, s]))
            if surplus[t, d, s] > 0:
                column = totals[t][:, :, s]
                reference = lower_median_index(own[t, :, s])
                out[d, s] = bool(beyond_noise(column, reference, np.array([d]), surplus[t, d, s : s + 1])[0])
    return out
