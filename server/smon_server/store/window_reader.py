"""Read a job's analysis window as StepColumns chunks, in the order the pass converts them.

The records of a whole 4,096-rank window decoded at once would take gigabytes, so a big window
is read `COLD_CHUNK_STEPS` steps at a time, by the steps that exist (a job numbering its steps by
samples, or a restored one, would make ranges of numbers that are almost all empty, or billions
of them). On PostgreSQL the next chunk is read (by the database, in another process) while the
pass converts this one. Each read is one `store/step_window.read_window`.

This module only reads: what the chunks become is the pass's (jobs/window_ops.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from smon_server.columns import StepColumns, worker_ids
from smon_server.store.models import Agent, Job, StepRecord
from smon_server.store.queries import newest_steps
from smon_server.store.step_window import read_window

# A cold window is read this many steps at a time.
COLD_CHUNK_STEPS = 64
# A window of at most this many records (world size × steps) is read in one query: chunking a
# 64-rank × 500-step window cost eight queries and a join for nothing (0.24 -> 0.18 CPU s a cold
# pass). Bigger ones are quicker in chunks too (a 512-rank window read whole: 1.7 -> 2.0 s).
WHOLE_READ_RECORDS = 65_536


@dataclass(frozen=True)
class Chunk:
    """The records of steps [from_step, to_step] (either open when None): every one stored."""

    from_step: int | None
    to_step: int | None
    records: StepColumns


def read(session: Session, job: Job, from_step: int | None, to_step: int | None) -> Chunk:
    """One read of steps [from_step, to_step]."""
    return Chunk(
        from_step, to_step, read_window(session=session, job=job, from_step=from_step, to_step=to_step)
    )


def read_whole(job: Job, lo: int | None, hi: int | None) -> bool:
    """Whether the window [lo, hi] and the step before it are read in one query, not in chunks."""
    if lo is None or hi is None or hi - lo < 2 * COLD_CHUNK_STEPS:
        return True
    return max(job.world_size, 1) * (hi - lo + 2) <= WHOLE_READ_RECORDS


def chunks(session: Session, job: Job, lo: int, hi: int) -> Iterator[Chunk]:
    """Steps [lo, hi] in chunks of `COLD_CHUNK_STEPS` steps that exist, oldest first; on
    PostgreSQL, each read while the one before is used."""
    bounds = chunk_bounds(newest_steps(session=session, job=job, lo=lo, hi=hi)[::-1], COLD_CHUNK_STEPS)
    if not bounds:
        return
    engine = session.get_bind()
    if engine.dialect.name != "postgresql":
        for a, b in bounds:
            yield read(session, job, a, b)
        return

    def own_read(a: int, b: int) -> Chunk:
        with Session(engine) as own:
            return read(own, job, a, b)

    with ThreadPoolExecutor(1, thread_name_prefix="smon-window-read") as reader:
        pending = reader.submit(own_read, *bounds[0])
        for following in [*bounds[1:], None]:
            chunk = pending.result()
            if following is not None:
                pending = reader.submit(own_read, *following)
            yield chunk


def chunk_bounds(steps: Sequence[int], size: int) -> list[tuple[int, int]]:
    """[first, last] step of each run of `size` of the ascending distinct `steps`."""
    return [(steps[i], steps[min(i + size, len(steps)) - 1]) for i in range(0, len(steps), size)]


def window_workers(session: Session, job: Job, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """What `columns.reporting_workers` gives for the records of steps [lo, hi], from one
    aggregate query (before a chunked read: which workers make a step complete)."""
    newest = dict(
        session.execute(
            select(StepRecord.agent_key, func.max(StepRecord.step))
            .where(StepRecord.job_key == job.key, StepRecord.step >= lo, StepRecord.step <= hi)
            .group_by(StepRecord.agent_key)
        ).all()
    )
    agents = session.execute(
        select(Agent.key, Agent.dp_rank, Agent.pp_rank).where(
            Agent.job_id == job.job_id, Agent.attempt == job.attempt
        )
    ).all()
    ids = worker_ids(
        np.array([a[1] for a in agents], dtype=np.int64), np.array([a[2] for a in agents], dtype=np.int64)
    )
    coords = dict(zip([a[0] for a in agents], ids.tolist(), strict=True))
    last: dict[int, int] = {}
    for agent, step in newest.items():
        worker = coords.get(agent)
        if worker is not None:
            last[worker] = max(last.get(worker, int(step)), int(step))
    workers = np.array(sorted(last), dtype=np.int64)
    return workers, np.array([last[w] for w in workers], dtype=np.int64)
