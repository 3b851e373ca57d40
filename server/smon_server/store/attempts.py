"""Which attempt of its job each batch goes to, so a job restarted under the same id is never mixed
with its old run.

A job restarted under the same id (a torchrun elastic restart, a resubmission) numbers its steps
again from 0 or from its checkpoint: stored under the old run, its records would share step numbers
with the old ones, and the window, S, stragglers, trend and GPU-hours would blend both runs. So
each job has attempts, numbered from 1, each its own `jobs` row with its own integer key (every
step record and phase column carries it). A batch goes to its agent's attempt, which is decided
once, when the agent's first batch is stored (docs/server.md "Attempts"):

- an agent stays in the attempt it first reported into: a late batch of an old run (resent after
  a reconnect, flushed at exit) stays in the old attempt;
- a new agent of a job whose current (newest) attempt has no live agent left (each said goodbye or
  has been silent longer than SMON_STALL_SECONDS) starts a new attempt: the job was resubmitted;
  unless that attempt is still filling: fewer of its ranks have reported than its world size, this
  agent's rank is not among them, and it was heard from within SMON_STALL_SECONDS (a short run
  whose first rank finished before the last one's shipper sent anything);
- otherwise it joins the current attempt (a rank restarted inside a running attempt), unless the
  attempt identities the agents report (Coordinates.attempt: a launcher's restart count) differ:
  a larger one than the current attempt's starts a new attempt (an elastic restart, whose old
  workers were killed moments ago and are not silent long yet); a smaller one joins the live
  attempt that reported it (an agent of the old run whose first batch came late), or else starts
  a new attempt (a resubmission whose launcher counts from 0 again).

Replicas agree: a new agent's attempt is decided under a transaction-scoped advisory lock on its
job id, held until the group holding the batch commits, so the next decision, on any replica, sees
the agents and attempts this one stored. The lock is taken only for groups with an agent not seen
before, and before any job or agent row is locked (in job id order), so writers cannot deadlock.
An agent's attempt never changes once committed, so each process keeps it: a group of known
agents costs a dictionary lookup per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from smon_server.store.leases import try_lease
from smon_server.store.models import Agent, Job
from smon_server.store.rows import ValidBatch

DEFAULT_STALL_SECONDS = 120.0  # SMON_STALL_SECONDS' default, for writers that are not told
LEASE_PREFIX = "smon/attempt/"
_LOOKUP_CHUNK = 1000  # agent ids per IN list (SQLite's bound-parameter limit)


class AgentAttempts:
    """agent_id -> attempt, for agents whose attempt is committed: the process-wide cache."""

    def __init__(self, limit: int = 500_000) -> None:
        self.limit = limit
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, agent_id: str) -> int | None:
        return self._attempts.get(agent_id)

    def remember(self, attempts: Mapping[str, int]) -> None:
        """Call once the transaction that stored these agents has committed."""
        with self._lock:
            if len(self._attempts) + len(attempts) > self.limit:
                self._attempts.clear()  # rebuilt from the agents table as agents send again
            self._attempts.update(attempts)


def assign(
    session: Session,
    batches: Sequence[ValidBatch],
    *,
    now: float,
    stall_seconds: float,
    known: AgentAttempts,
) -> dict[str, int]:
    """Set each batch's `attempt`. Returns agent_id -> attempt of every batch's agent, for
    `known.remember` once the caller's transaction has committed."""
    attempts: dict[str, int] = {}
    unknown: list[ValidBatch] = []
    for b in batches:
        cached = known.get(b.agent_id)
        if cached is None:
            unknown.append(b)
        else:
            attempts[b.agent_id] = cached
    if unknown:
        attempts.update(_decide(session, unknown, batches, attempts, now - stall_seconds))
    for b in batches:
        b.attempt = attempts[b.agent_id]
    return attempts


def _decide(
    session: Session,
    unknown: Sequence[ValidBatch],
    batches: Sequence[ValidBatch],
    cached: Mapping[str, int],
    live_since: float,
) -> dict[str, int]:
    """The attempts of the agents not in the cache: stored ones read back (a restarted server,
    an agent that reconnected to another replica), new ones decided under their jobs' locks."""
    out = _stored(session, sorted({b.agent_id for b in unknown}))
    new_jobs = sorted({b.job_id for b in unknown if b.agent_id not in out})
    if not new_jobs:
        return out
    for job_id in new_jobs:
        try_lease(session, LEASE_PREFIX + job_id, wait=True)
    # Stored by another writer while this one waited for the lock: theirs stands.
    out.update(_stored(session, sorted({b.agent_id for b in unknown if b.agent_id not in out})))
    first: dict[str, ValidBatch] = {}  # each new agent's earliest batch in the group
    for b in unknown:
        if b.agent_id not in out and (b.agent_id not in first or b.seq < first[b.agent_id].seq):
            first[b.agent_id] = b
    by_job: dict[str, list[ValidBatch]] = {}
    for b in first.values():
        by_job.setdefault(b.job_id, []).append(b)
    for job_id, new in sorted(by_job.items()):
        state = _JobAttempts.load(session, job_id, live_since)
        # The group's known agents of the job that did not say goodbye are live, whatever their
        # stored last_seen says (they are sending right now).
        for b in batches:
            sending = out.get(b.agent_id, cached.get(b.agent_id))
            if b.job_id == job_id and not b.final and sending is not None:
                state.live.add(sending)
        for b in sorted(new, key=lambda b: b.agent_id):
            out[b.agent_id] = state.place(b.reported_attempt, b.coords.rank, b.coords.world_size)
    return out


def _stored(session: Session, agent_ids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in range(0, len(agent_ids), _LOOKUP_CHUNK):
        chunk = agent_ids[i : i + _LOOKUP_CHUNK]
        rows = session.execute(select(Agent.agent_id, Agent.attempt).where(Agent.agent_id.in_(chunk)))
        out.update({str(a): int(n) for a, n in rows})
    return out


@dataclass
class _JobAttempts:
    """One job's attempts as the decision sees them: each one's reported identity, and which
    have a live agent (one that did not say goodbye and was heard from lately).

    Read from the database as the rules need them, never as all of a job's agents: while a
    16,384-rank job starts, every group holding a new agent decides here, and reading every
    stored agent of the attempt each time made its start quadratic (2,048 host batches reading
    up to 16,384 agents each). What is live is asked per attempt (an EXISTS on the agents index);
    how far the current attempt has filled only when it has no live agent (the rule that needs
    it: a resubmission, or a short run's last ranks)."""

    session: Session
    job_id: str
    live_since: float
    reported: dict[int, int | None]
    live: set[int] = field(default_factory=set)  # attempts known live (asked, joined, or sending)
    not_live: set[int] = field(default_factory=set)  # attempts asked and found without a live agent

    @classmethod
    def load(cls, session: Session, job_id: str, live_since: float) -> _JobAttempts:
        reported = {
            int(n): r
            for n, r in session.execute(select(Job.attempt, Job.reported_attempt).where(Job.job_id == job_id))
        }
        return cls(session, job_id, live_since, reported)

    def is_live(self, attempt: int) -> bool:
        if attempt in self.live:
            return True
        if attempt in self.not_live:
            return False
        found = self.session.scalar(
            select(Agent.key)
            .where(
                Agent.job_id == self.job_id,
                Agent.attempt == attempt,
                Agent.final.is_(False),
                Agent.last_seen >= self.live_since,
            )
            .limit(1)
        )
        (self.live if found is not None else self.not_live).add(attempt)
        return found is not None

    def place(self, reported: int | None, rank: int = -1, world_size: int = 0) -> int:
        """The attempt a new agent reporting `reported` goes to (rules in the module docstring)."""
        if not self.reported:
            return self._open(reported)
        current = max(self.reported)
        if not self.is_live(current):
            if self._filling(current, reported, rank, world_size):
                return self._join(current, reported)
            return self._open(reported)  # every agent of the current run is gone: resubmitted
        theirs = self.reported[current]
        if reported is None or theirs is None or reported == theirs:
            return self._join(current, reported)
        if reported > theirs:
            return self._open(reported)  # a restart whose old workers were killed moments ago
        older = [n for n, r in self.reported.items() if r == reported and self.is_live(n)]
        return self._join(max(older), reported) if older else self._open(reported)

    def _filling(self, current: int, reported: int | None, rank: int, world_size: int) -> bool:
        """Whether the current attempt still waits for this rank: a short run's last ranks (it
        was heard from lately, fewer of its ranks reported than its world size, this one not)."""
        theirs = self.reported[current]
        if not (0 <= rank < world_size and (reported is None or theirs is None or reported == theirs)):
            return False
        of_current = (Agent.job_id == self.job_id, Agent.attempt == current)
        size = self.session.scalar(
            select(Job.world_size).where(Job.job_id == self.job_id, Job.attempt == current)
        )
        if world_size != int(size or 0):
            return False
        ranks, newest = self.session.execute(
            select(func.count(distinct(Agent.rank)), func.max(Agent.last_seen)).where(*of_current)
        ).one()
        if newest is None or float(newest) < self.live_since or int(ranks) >= world_size:
            return False
        return self.session.scalar(select(Agent.key).where(*of_current, Agent.rank == rank).limit(1)) is None

    def _open(self, reported: int | None) -> int:
        attempt = max(self.reported, default=0) + 1
        self.reported[attempt] = reported
        self.live.add(attempt)
        return attempt

    def _join(self, attempt: int, reported: int | None) -> int:
        # As the jobs upsert does: an attempt keeps the largest identity its agents reported.
        mine = self.reported[attempt]
        if reported is not None and (mine is None or reported > mine):
            self.reported[attempt] = reported
        self.live.add(attempt)
        return attempt


def name(job_id: str, attempt: int) -> str:
    """One string per job attempt, for leases and per-attempt bookkeeping. Attempt 1 is named by
    its job id alone, as jobs were before they had attempts (a replica not yet upgraded takes the
    same lease)."""
    return job_id if attempt == 1 else f"{job_id}@{attempt}"


def reported_attempt(batches: Iterable[ValidBatch]) -> int | None:
    """The largest attempt identity the batches' agents reported, None when none did."""
    return max((r for b in batches if (r := b.reported_attempt) is not None), default=None)
