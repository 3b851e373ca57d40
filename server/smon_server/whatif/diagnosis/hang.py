"""hang: heartbeats keep coming but no step completes; the heartbeats say where each rank stands.

Ranks behind the others (an older step), or in a different phase than the majority of the ranks
at the newest step, are the suspects: the majority is usually waiting in a collective for them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from smon_server.whatif.diagnosis.base import HANG, Diagnosis
from smon_server.whatif.signals import RankPosition, Signals


def hang(signals: Signals) -> list[Diagnosis]:
    """Needs only the heartbeat signals: a hung job may have no complete step to analyse."""
    h = signals.hang
    if h is None or not h.stalled or h.seconds_since_step < h.threshold_seconds:
        return []
    known = [p for p in h.positions if p.step is not None]
    suspects: list[RankPosition] = []
    waiting_phase, newest = "", None
    if known:
        newest = max(p.step for p in known if p.step is not None)
        behind = [p for p in known if p.step != newest]
        at_newest = [p for p in known if p.step == newest]
        phases = Counter(p.phase for p in at_newest)
        waiting_phase = phases.most_common(1)[0][0] if phases else ""
        odd = [p for p in at_newest if p.phase != waiting_phase] if len(phases) > 1 else []
        suspects = behind or odd
    groups: dict[str, list[int]] = {}
    for p in sorted(h.positions, key=lambda p: p.rank):
        key = f"step {p.step} / {p.phase or 'no phase'}" if p.step is not None else "unknown"
        groups.setdefault(key, []).append(p.rank)
    evidence: dict[str, Any] = {
        "seconds_since_step": round(h.seconds_since_step, 1),
        "last_step": newest,
        "positions": {k: _ranges(v) for k, v in groups.items()},
        "suspect_ranks": _ranges([p.rank for p in suspects]),
    }
    if suspects:
        s0 = suspects[0]
        hosts = sorted({p.host or signals.hosts.get(p.rank, "") for p in suspects} - {""})
        where = f" on {', '.join(hosts)}" if hosts else ""
        others = len(known) - len(suspects)
        advice = (
            f"No step for {h.seconds_since_step:.0f} s. Rank(s) {_ranges([p.rank for p in suspects])}"
            f"{where} stand at step {s0.step} in '{s0.phase or 'no phase'}' while {others} ranks "
            f"wait in '{waiting_phase or 'no phase'}' at step {newest}: dump their stacks "
            "(py-spy dump --pid <pid>), check their GPUs for XID errors (dmesg), then restart "
            "from the last checkpoint without the faulty host."
        )
    else:
        advice = (
            f"No step for {h.seconds_since_step:.0f} s and every rank stands at the same place "
            f"('{waiting_phase or 'no phase'}'): a collective or the input pipeline is stuck on all "
            "ranks; dump stacks on a few ranks (py-spy dump) and check the NCCL watchdog log."
        )
    return [
        Diagnosis(
            cause=HANG,
            share=1.0,
            confidence=0.9 if suspects else 0.6,
            evidence=evidence,
            recommendation=advice,
            ranks=tuple(p.rank for p in suspects),
        )
    ]


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': readable for thousands of ranks."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = out[-1].split("-")[0] + f"-{r}"
        else:
            out.append(str(r))
    return ",".join(out)
