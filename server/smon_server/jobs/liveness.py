"""Is a job running, stalled (alive but no step ends), or finished? And where do hung ranks stand?

A hung job keeps sending heartbeats (the agent's shipper thread is alive) while no step completes;
a finished or dead job stops sending altogether. The heartbeat names each rank's step and open
phase, which is what tells "ranks {0,1,3} wait in grad_sync for rank 2, stuck in forward".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from smon_server.store.models import Job
from smon_server.store.queries import RankAgent
from smon_server.whatif.signals import RankPosition


class JobState(StrEnum):
    RUNNING = "running"
    STALLED = "stalled"
    FINISHED = "finished"


@dataclass(frozen=True)
class Liveness:
    state: JobState
    seconds_since_step: float
    positions: tuple[RankPosition, ...] = ()  # each rank's last heartbeat (a stalled job's)


def job_liveness(
    job: Job, agents: Sequence[RankAgent], *, now: float, stall_seconds: float, superseded: bool = False
) -> Liveness:
    since_step = now - (job.last_step_seen if job.last_step_seen is not None else job.first_seen)
    state = job_state(
        job,
        all_final=bool(agents) and all(a.final for a in agents),
        last_heard=max((a.last_seen for a in agents), default=None),
        now=now,
        stall_seconds=stall_seconds,
        superseded=superseded,
    )
    # Where each rank stands matters only to a stalled job (the hang rule): 16,384 of them were
    # ~0.14 s of every pass of a running one.
    positions: tuple[RankPosition, ...] = ()
    if state is JobState.STALLED:
        positions = tuple(
            RankPosition(rank=a.rank, step=a.hb_current_step, phase=a.hb_phase, host=a.host)
            for a in sorted(agents, key=lambda a: a.rank)
        )
    return Liveness(state, since_step, positions)


def job_state(
    job: Job,
    *,
    all_final: bool,
    last_heard: float | None,
    now: float,
    stall_seconds: float,
    superseded: bool = False,
) -> JobState:
    """The state of one job attempt from two facts about its newest agent per rank
    (queries.liveness_facts computes them in SQL for a whole page of jobs): have they all said
    goodbye, and when was any of them last heard from. An attempt `superseded` by a newer one of
    the same job is finished: its run is over, even while its killed workers' last batches
    still arrive."""
    since_step = now - (job.last_step_seen if job.last_step_seen is not None else job.first_seen)
    if all_final or superseded:
        return JobState.FINISHED
    if now - (last_heard if last_heard is not None else job.last_seen) > stall_seconds:
        # Nothing heard at all, not even heartbeats: the processes are gone.
        return JobState.FINISHED
    if since_step > stall_seconds:
        return JobState.STALLED
    return JobState.RUNNING
