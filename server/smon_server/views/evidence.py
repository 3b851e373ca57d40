"""A diagnosis's evidence object as sentences for people: `smon demo` and `smon analyze` print
these. The API keeps the object itself (DESIGN §6); the dashboard renders it on its own.

Each cause has its own wording (the keys are those whatif/diagnosis writes for it). Evidence is
stored JSON that may come from an older server: a part that is missing or of another shape is
left out, and an object no wording fits is listed as `key value` pairs rather than failing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from smon_server.whatif.diagnosis.base import (
    CHECKPOINT_IO,
    COMMUNICATION,
    DATA_LOADER,
    GPU_THROTTLING,
    HANG,
    HOST_WORK,
    PYTHON_GC,
    SEQUENCE_IMBALANCE,
    SLOW_WORKER,
    STAGE_IMBALANCE,
)

Evidence = Mapping[str, Any]
NAMED_WORKERS = 3  # workers named one by one; the rest are counted


def sentences(cause: str, evidence: Evidence) -> list[str]:
    """What `evidence` says, a sentence each, in the order a reader needs them."""
    if not isinstance(evidence, Mapping):
        return [str(evidence)] if evidence not in (None, "") else []
    write = _WRITERS.get(cause)
    out: list[str] = []
    if write is not None:
        try:
            out = [s for s in write(evidence) if s]
        except (KeyError, TypeError, ValueError, AttributeError):
            out = []
    if not out:
        out = [_pairs({k: v for k, v in evidence.items() if k != "analysis_flag"})]
    if evidence.get("analysis_flag"):
        out.append(f"Less certain: {evidence['analysis_flag']}.")
    return [s for s in out if s]


# -- wording per cause ------------------------------------------------------------------------


def _workers(e: Evidence) -> list[str]:
    out = []
    workers = list(e.get("workers") or [])
    for w in workers[:NAMED_WORKERS]:
        line = f"{_cap(_who(w))} computes {_ratio(w['compute_ratio'])} as long as its stage peers"
        if w.get("s_w") is not None:
            line += f"; alone, it slows the job {_ratio(w['s_w'])}"
        out.append(line + ".")
    if len(workers) > NAMED_WORKERS:
        out.append(f"{len(workers) - NAMED_WORKERS} more workers compute slowly too.")
    if e.get("worker_share") is not None:
        line = f"Slow workers account for {_share(e['worker_share'])} of the slowdown"
        if e.get("slowest_in_steps") is not None:
            line += f", and a named worker is the slowest on {_pct(e['slowest_in_steps'])} of steps"
        out.append(line + ".")
    for rank, gpu in dict(e.get("gpu") or {}).items():
        out.append(f"Rank {rank}'s GPU: {_gpu(gpu)}.")
    return out


def _gc(e: Evidence) -> list[str]:
    out = [f"Python GC pauses account for {_share(e['gc_share'])} of the slowdown."]
    if e.get("worker_steps_with_gc"):
        out.append(
            f"A rank pauses in {_pct(e['worker_steps_with_gc'])} of its steps, "
            f"for {_seconds(e['mean_pause_s'])} on average."
        )
    with_gc, without = e.get("slowdown_steps_with_gc"), e.get("slowdown_steps_without_gc")
    if with_gc is not None and without is not None:
        out.append(
            f"Steps with a pause run {_ratio(with_gc)} their ideal time, steps without {_ratio(without)}."
        )
    return out


def _data(e: Evidence) -> list[str]:
    out = [f"Waiting for input batches accounts for {_share(e['data_wait_share'])} of the slowdown."]
    median = e.get("median_data_wait_s")
    for w in list(e.get("workers") or [])[:NAMED_WORKERS]:
        line = f"{_cap(_who(w))} waits {_seconds(w['data_wait_s'])} per step for its batch"
        out.append(line + (f"; the median rank waits {_seconds(median)}." if median is not None else "."))
    return out


def _communication(e: Evidence) -> list[str]:
    backend = f" ({e['backend']})" if e.get("backend") else ""
    out = [f"Communication accounts for {_share(e['communication_share'])} of the slowdown."]
    if e.get("transfer_over_ideal") is not None:
        out.append(f"Transfers{backend} take {_ratio(e['transfer_over_ideal'])} their ideal time overall.")
    worst = e.get("worst_worker")
    if worst:
        out.append(
            f"The slowest transfers are on {_who(worst)}: "
            f"{_ratio(worst['transfer_ratio'])} the median of its stage."
        )
    if e.get("by_op_type"):
        out.append(
            f"Measured alone (everything else ideal), they slow the job: {_per_type(e['by_op_type'])}."
        )
    return out


def _checkpoint(e: Evidence) -> list[str]:
    regular = float(e.get("regularity", 1.0))
    gaps = f" ({_pct(regular)} of the gaps are that long)" if regular < 1.0 else ""
    return [
        f"{e['checkpoints']} checkpoints, every {e['interval_steps']} steps{gaps}, "
        f"stop every rank for {_seconds(e['mean_seconds'])} each.",
        f"They take {_pct(e['time_share'])} of the training time.",
    ]


def _host(e: Evidence) -> list[str]:
    out = [f"Work outside the timed phases accounts for {_share(e['host_work_share'])} of the slowdown."]
    for w in list(e.get("workers") or [])[:NAMED_WORKERS]:
        line = f"{_cap(_who(w))} spends {_seconds(w['extra_s_per_step'])} more per step there than its peers"
        out.append(line + _when(w) + ".")
    return out


def _stage(e: Evidence) -> list[str]:
    out = [
        f"Stage {e['stage']} computes {_ratio(e['compute_ratio'])} the mean stage and is the heaviest "
        f"on {_pct(e['heaviest_in_steps'])} of steps."
    ]
    if e.get("per_stage_compute_ratio"):
        out.append(
            f"Compute per stage, against the mean: {_per_type(e['per_stage_compute_ratio'], 'stage ')}."
        )
    if e.get("stage_share") is not None:
        out.append(f"Stage imbalance accounts for {_share(e['stage_share'])} of the slowdown.")
    return out


def _sequence(e: Evidence) -> list[str]:
    out = [
        f"Slowness that moves from step to step accounts for {_share(e['transient_share'])} of the slowdown.",
        f"Micro-batch compute varies by {_pct(e['microbatch_cv'])} within a worker and "
        f"{_pct(e['worker_cv'])} between workers.",
    ]
    if e.get("distinct_slowest_workers") is not None:
        out.append(
            f"{e['distinct_slowest_workers']} different workers were the slowest of a step; "
            f"no single one on more than {_pct(e['slowest_worker_persistence'])} of steps."
        )
    if e.get("seq_sq_correlation") is not None:
        out.append(f"Compute follows Σ len² of the sequences (correlation {e['seq_sq_correlation']:.2f}).")
    return out


def _hang(e: Evidence) -> list[str]:
    out = [f"No step has completed for {_seconds(e['seconds_since_step'])} (the last was {e['last_step']})."]
    positions = [_position(where, ranks) for where, ranks in dict(e.get("positions") or {}).items()]
    if positions:
        out.append(_cap("; ".join(positions)) + ".")
    if e.get("suspect_ranks"):
        suspects = str(e["suspect_ranks"])
        out.append(f"Suspect: rank {suspects}." if suspects.isdigit() else f"Suspects: ranks {suspects}.")
    return out


_WRITERS: dict[str, Callable[[Evidence], list[str]]] = {
    SLOW_WORKER: _workers,
    GPU_THROTTLING: _workers,
    PYTHON_GC: _gc,
    DATA_LOADER: _data,
    COMMUNICATION: _communication,
    CHECKPOINT_IO: _checkpoint,
    HOST_WORK: _host,
    STAGE_IMBALANCE: _stage,
    SEQUENCE_IMBALANCE: _sequence,
    HANG: _hang,
}


# -- the pieces --------------------------------------------------------------------------------


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _who(w: Mapping[str, Any]) -> str:
    """'rank 2 on node-1 (DP rank 2)', with the stage where there is a pipeline."""
    host = f" on {w['host']}" if w.get("host") else ""
    stage = f", stage {w['stage']}" if w.get("stage") else ""
    return f"rank {w['rank']}{host} (DP rank {w['dp_rank']}{stage})"


def _position(where: str, ranks: str) -> str:
    """hang.py's 'step 812 / grad_sync' -> 'ranks 0-1,3 at step 812 in grad_sync'."""
    who = f"rank {ranks}" if ranks.isdigit() else f"ranks {ranks}"
    at = re.fullmatch(r"step (\S+) / (.+)", where)
    return f"{who} at step {at[1]} in {at[2]}" if at else f"{who}: {where}"


def _when(w: Mapping[str, Any]) -> str:
    if w.get("on_every_step"):
        return ", on every step"
    if w.get("every_n_steps"):
        return f", every {w['every_n_steps']} steps (up to {_seconds(w['max_s'])})"
    if w.get("steps_affected") is not None and w.get("steps_analysed"):
        return f", on {w['steps_affected']} of {w['steps_analysed']} steps"
    return ""


def _gpu(h: Mapping[str, Any]) -> str:
    parts = []
    if h.get("throttled_fraction"):
        parts.append(f"throttled in {_pct(h['throttled_fraction'])} of samples")
    if h.get("sm_clock_ratio") is not None:
        parts.append(f"SM clock at {_pct(h['sm_clock_ratio'])} of its maximum")
    if h.get("ecc_uncorrected"):
        parts.append(f"{h['ecc_uncorrected']} uncorrected ECC errors")
    if h.get("xid_events"):
        parts.append(f"{h['xid_events']} XID events")
    return ", ".join(parts) or "no throttling or errors reported"


def _per_type(values: Mapping[str, Any], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{name} {_ratio(v)}" for name, v in values.items() if v is not None)


def _pct(x: float) -> str:
    return f"{float(x):.0%}"


def _share(x: float) -> str:
    """A share of the slowdown: the engine's parts may overshoot a little (base.clip01)."""
    return _pct(min(max(float(x), 0.0), 1.0))


def _ratio(x: float) -> str:
    return f"{float(x):.2f}x"


def _seconds(x: float) -> str:
    x = float(x)
    if x >= 1:
        return f"{x:.1f} s"
    return f"{x * 1000:.3g} ms"


def _pairs(evidence: Mapping[str, Any]) -> str:
    """The fallback: scalar fields as 'key value', joined."""
    parts = []
    for key, value in evidence.items():
        if isinstance(value, bool | int | float | str):
            shown = f"{value:.3g}" if isinstance(value, float) else str(value)
            parts.append(f"{key.replace('_', ' ')} {shown}")
        elif isinstance(value, Sequence) and all(isinstance(v, int | float | str) for v in value):
            parts.append(f"{key.replace('_', ' ')} {', '.join(map(str, value))}")
    return "; ".join(parts)
