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

from smon_server.store import attempts
from smon_server.store.models import AnalysisResult, Job

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


# A job this replica does not own is analysed here all the same when its stored analysis is this
# many intervals (and at least OVERDUE_SECONDS) behind its news: its owner is alive (its lock is
# held) but not keeping up, or hung. A dead owner needs none of this: its lock goes with it.
OVERDUE_INTERVALS = 5.0
OVERDUE_SECONDS = 60.0
# A job that has sent nothing for this long costs (almost) nothing a pass: it weighs nothing in
# the shares, so idle jobs do not skew them (they are still spread, by their hashes).
IDLE_SECONDS = 3600.0


@dataclass(frozen=True)
class Listed:
    """A job attempt as the pass lists it."""

    job_id: str
    attempt: int
    world_size: int
    first_seen: float
    last_seen: float
    computed_at: float | None  # its stored analysis's, if any

    @classmethod
    def of(cls, job: Job, stored: AnalysisResult | None) -> Listed:
        computed = stored.computed_at if stored is not None else None
        return cls(job.job_id, job.attempt, job.world_size or 0, job.first_seen, job.last_seen, computed)

    @property
    def name(self) -> str:
        return attempts.name(self.job_id, self.attempt)

    def weight(self, now: float) -> float:
        return float(max(1, self.world_size)) if now - self.last_seen < IDLE_SECONDS else 0.0

    def overdue(self, now: float, interval: float) -> bool:
        since = self.computed_at if self.computed_at is not None else self.first_seen
        return self.last_seen > since and now - since > max(OVERDUE_INTERVALS * interval, OVERDUE_SECONDS)


@dataclass(frozen=True)
class Share:
    mine: list[Listed]  # this replica's jobs, then those taken over
    assigned: int
    taken_over: int


def share(listed: Sequence[Listed], me: int, replicas: Sequence[int], now: float, interval: float) -> Share:
    """The jobs this replica analyses this pass, in the order listed."""
    owners = assign((Work(j.name, j.weight(now)) for j in listed), replicas)
    mine = [j for j in listed if owners.get(j.name, me) == me]
    overdue = [j for j in listed if owners.get(j.name, me) != me and j.overdue(now, interval)]
    return Share(mine=mine + overdue, assigned=len(mine), taken_over=len(overdue))
