"""Build wire-protocol batches the way an agent would, and stored jobs, for ingest, store and API tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from smon.v1 import ingest_pb2 as pb

T0 = 1_790_000_000.0  # a fixed wall-clock origin (2026) so tests are deterministic


def coords(job: str, rank: int, world_size: int, *, host: str = "host-0") -> pb.Coordinates:
    return pb.Coordinates(
        job=job,
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        host=host,
        dp_rank=rank,
        pp_rank=0,
        tp_rank=0,
        dp_size=world_size,
        pp_size=1,
        tp_size=1,
        pid=1000 + rank,
        agent_version="test",
    )


def dp_step(
    step: int,
    *,
    start: float,
    data_wait: float = 0.002,
    forward: float = 0.010,
    backward: float = 0.020,
    grad_sync_start: float | None = None,
    grad_sync_end: float | None = None,
    optimizer: float = 0.003,
    gc: Sequence[tuple[float, float]] = (),
) -> pb.StepRecord:
    """One data-parallel step laid out like the agent records it (spans in start order).

    `grad_sync_start/end` are absolute times: the exposed gradient sync ends when the slowest
    rank's gradients are in, which the caller knows and this function cannot.
    """
    t = start
    spans = [pb.Span(kind="data_wait", start=t, duration=data_wait)]
    t += data_wait
    spans.append(pb.Span(kind="forward", start=t, duration=forward))
    t += forward
    spans.append(pb.Span(kind="backward", start=t, duration=backward))
    t += backward
    gs_start = t if grad_sync_start is None else grad_sync_start
    gs_end = t if grad_sync_end is None else grad_sync_end
    spans.append(pb.Span(kind="grad_sync", start=gs_start, duration=gs_end - gs_start))
    t = gs_end
    spans.append(pb.Span(kind="optimizer", start=t, duration=optimizer))
    t += optimizer
    for g_start, g_duration in gc:
        spans.append(pb.Span(kind="gc", start=start + g_start, duration=g_duration))
    phases: dict[str, float] = {}
    for span in spans:
        phases[span.kind] = phases.get(span.kind, 0.0) + span.duration
    return pb.StepRecord(
        step=step,
        start_time=start,
        end_time=t,
        duration=t - start,
        phases=phases,
        spans=spans,
        gc_count=len(gc),
        gc_seconds=sum(d for _, d in gc),
    )


def dp_job_steps(
    world_size: int,
    steps: Iterable[int],
    *,
    slow_rank: int | None = None,
    slow_forward: float = 0.0,
    forward: float = 0.010,
    backward: float = 0.020,
    transfer: float = 0.004,
    optimizer: float = 0.003,
    data_wait: float = 0.002,
    origin: float = T0,
) -> dict[int, list[pb.StepRecord]]:
    """Step records of a synchronous DP job: each step's all-reduce ends `transfer` after the
    slowest rank joins it, so a slow rank makes everyone else wait (exposed grad sync)."""
    out: dict[int, list[pb.StepRecord]] = {r: [] for r in range(world_size)}
    t = origin
    for step in steps:
        fwd = [forward + (slow_forward if r == slow_rank else 0.0) for r in range(world_size)]
        ready = [t + data_wait + fwd[r] + backward for r in range(world_size)]
        sync_end = max(ready) + transfer
        for r in range(world_size):
            out[r].append(
                dp_step(
                    step,
                    start=t,
                    data_wait=data_wait,
                    forward=fwd[r],
                    backward=backward,
                    grad_sync_start=ready[r],
                    grad_sync_end=sync_end,
                    optimizer=optimizer,
                )
            )
        t = sync_end + optimizer
    return out


def batch(
    job: str,
    rank: int,
    world_size: int,
    *,
    seq: int = 1,
    steps: Sequence[pb.StepRecord] = (),
    gpu_samples: Sequence[pb.GpuSample] = (),
    heartbeat: pb.Heartbeat | None = None,
    agent_id: str | None = None,
    final: bool = False,
    host: str = "host-0",
) -> pb.Batch:
    b = pb.Batch(
        agent_id=agent_id or f"agent-{job}-{rank}",
        seq=seq,
        coords=coords(job, rank, world_size, host=host),
        steps=steps,
        gpu_samples=gpu_samples,
        final=final,
        sent_time=T0,
    )
    if heartbeat is not None:
        b.heartbeat.CopyFrom(heartbeat)
    return b


def new_job_id(prefix: str = "job") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _unique_key() -> int:
    """An integer key for a row written straight to the store: SQLite has no identity column (the
    server's writes.py assigns keys there), and on PostgreSQL a key far above the identity
    sequence's cannot collide with the ones the server assigns."""
    return 2**30 + uuid.uuid4().int % 2**30


def stored_job(
    session: Any,
    job_id: str,
    now: float,
    *,
    seen_ago: float = 1.0,
    step_ago: float | None = 1.0,
    agents: Sequence[tuple[int, float, float, bool, int]] = (),
) -> None:
    """A job row and its agents written straight to the store. agents: (rank, first seen ago,
    last seen ago, final, dropped records)."""
    from smon_server.store.models import Agent, Job

    session.add(
        Job(
            job_id=job_id,
            key=_unique_key(),
            world_size=max((a[0] for a in agents), default=0) + 1,
            first_seen=now - 5000,
            last_seen=now - seen_ago,
            last_step=99,
            last_step_seen=None if step_ago is None else now - step_ago,
            gpu_hours_wasted=2.5,
        )
    )
    for rank, first_ago, last_ago, final, dropped in agents:
        session.add(
            Agent(
                agent_id=uuid.uuid4().hex,
                key=_unique_key(),
                job_id=job_id,
                rank=rank,
                first_seen=now - first_ago,
                last_seen=now - last_ago,
                final=final,
                dropped_records=dropped,
            )
        )
