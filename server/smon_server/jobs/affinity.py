"""Which replica analyses which job: each job stays with one replica while that replica lives.

A replica keeps each job's window between passes (jobs/window_ops.py, about 1.8 GB for a
4,096-rank job) and reads only the new steps; a job whose passes alternate between replicas pays
a cold pass on each. So every replica computes the same assignment from the same inputs (the
jobs listed, the live replicas from store/replicas.py) and analyses its own jobs only.

The assignment is rendezvous hashing with bounded loads: each job ranks the replicas by a hash of
(job, replica) and goes to the first with room, room being `1 + SLACK` times an even share of the
jobs' weight (their ranks: a 4,096-rank job costs what a thousand small ones do). Jobs are placed
biggest first, so the big ones spread before the small ones fill the gaps. A replica that leaves
hands on only its own jobs (and, where room binds, a few others); one that joins takes about its
share, mostly from the busiest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SLACK = 0.25


@dataclass(frozen=True)
class Work:
    name: str  # the job attempt's name (store/attempts.name)
    weight: float  # what its pass costs, relatively: its ranks


def _score(name: str, replica: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{name}\0{replica}".encode(), digest_size=8).digest(), "big")


def assign(work: Iterable[Work], replicas: Sequence[int], *, slack: float = SLACK) -> dict[str, int]:
    """Each job's replica (by name)."""
    jobs = list(work)
    if not replicas:
        return {}
    if len(replicas) == 1:
        return {w.name: replicas[0] for w in jobs}
    total = sum(w.weight for w in jobs)
    room = (1.0 + slack) * total / len(replicas)
    load = dict.fromkeys(replicas, 0.0)
    out: dict[str, int] = {}
    for w in sorted(jobs, key=lambda w: (-w.weight, w.name)):
        ranked = sorted(replicas, key=lambda r: _score(w.name, r), reverse=True)
        chosen = next((r for r in ranked if load[r] + w.weight <= room), None)
        if chosen is None:  # bigger than any replica's room left: the least loaded takes it
            chosen = min(ranked, key=lambda r: load[r])
        load[chosen] += w.weight
        out[w.name] = chosen
    return out
