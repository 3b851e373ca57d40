"""Stored job attempts with analyses naming stragglers, as the analysis loop leaves them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from smon_server.hosts import fleet, record
from smon_server.store.db import Database
from smon_server.store.models import Agent, AnalysisResult, GpuSample, Job

_keys = iter(range(10_000, 10**9))


def analysed_job(
    db: Database,
    job_id: str,
    *,
    hosts: Sequence[str],
    stragglers: Sequence[tuple[int, str, float]] = (),
    slowdown: float = 1.0,
    at: float,
    gpu_hours_wasted: float = 1.0,
    samples: Sequence[dict[str, Any]] = (),
    flagged: bool = False,
) -> set[str]:
    """A finished job attempt whose rank r ran on hosts[r] (GPU `GPU-<host>-<r>`) and whose
    stored analysis names `stragglers` ((rank, cause, S_w)); then charged to its hosts (as the
    analysis loop does). `samples`: GpuSample fields of its ranks. Returns the hosts touched."""
    with db.transaction() as s:
        job = Job(
            job_id=job_id,
            attempt=1,
            key=next(_keys),
            world_size=len(hosts),
            dp_size=len(hosts),
            first_seen=at - 600,
            last_seen=at,
            last_step=99,
            last_step_seen=at,
            gpu_hours_wasted=gpu_hours_wasted,
        )
        s.add(job)
        for rank, host in enumerate(hosts):
            s.add(
                Agent(
                    agent_id=uuid.uuid4().hex,
                    key=next(_keys),
                    job_id=job_id,
                    attempt=1,
                    rank=rank,
                    host=host,
                    gpu_uuid=f"GPU-{host}-{rank}",
                    dp_rank=rank,
                    first_seen=at - 600,
                    last_seen=at,
                    final=True,
                )
            )
        for sample in samples:
            s.add(GpuSample(job_id=job_id, gpu_index=0, **{"xid_events": [], **sample}))
        summary = {
            "slowdown": slowdown,
            "stragglers": [
                {
                    "rank": rank,
                    "host": hosts[rank],
                    "dp_rank": rank,
                    "stage": 0,
                    "slowdown": s_w,
                    "cause": cause,
                    "evidence": {"op_type": "forward-compute", "surplus_seconds": 0.04},
                }
                for rank, cause, s_w in stragglers
            ],
        }
        result = AnalysisResult(
            job_id=job_id,
            attempt=1,
            computed_at=at,
            state="finished",
            steps_seen=90,
            slowdown=slowdown,
            window_start=at - 500,
            window_end=at - 10,
            stragglers=len(stragglers),
            flagged=flagged,
            summary=summary,
        )
        s.add(result)
        s.flush()
        return record.record(s, job=job, result=result, now=at)


def refresh(db: Database, now: float, policy: fleet.Policy | None = None) -> None:
    with db.transaction() as s:
        fleet.refresh(s, now=now, policy=policy or fleet.Policy())
