"""A job's stored analysis and NVML samples, charged to the hosts its ranks ran on.

Called by the analysis loop right after it stores a job attempt's result (holding the job's
lease), so the fleet view is computed from stored analyses, never by analysing jobs again, and
stays after the raw step records go (host_jobs, host_incidents and host_gpu_events are rollups).

Who is charged (docs/hosts.md "Attribution"): a straggler counts against its own host only; ranks
that wait for it are not stragglers (the analysis names none), so their hosts are never charged.
Only causes a machine can be to blame for count: `slow_worker`, `gpu_throttling`, `data_loader`
and `host_work` (except on rank 0, the rank scripts give logging and evaluation to). Stage or
sequence imbalance, GC, checkpoints, communication and hangs are the job's own. When more
than half the job's ranks straggle, the slowdown is job-wide and counts against no host.
A pass whose replay is flagged (not trusted) charges nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from smon_server.hosts.gpu_events import Reading, derive
from smon_server.store import queries
from smon_server.store.models import (
    AnalysisResult,
    GpuSample,
    HostGpuEvent,
    HostIncident,
    HostJob,
    Job,
)
from smon_server.store.queries import RankAgent
from smon_server.whatif.diagnosis.base import DATA_LOADER, GPU_THROTTLING, HOST_WORK, SLOW_WORKER

COUNTED_CAUSES = frozenset({SLOW_WORKER, GPU_THROTTLING, DATA_LOADER, HOST_WORK})
# Seconds a host's last_seen may lag its agents' (above).
LAST_SEEN_STEP = 60.0
# GPU samples one pass turns into events at most (the rest wait for the next pass).
MAX_SAMPLES_PER_PASS = 100_000


def blamed(stragglers: Sequence[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """The stragglers that count against their own hosts (see the module's docstring)."""
    ranks = {int(s["rank"]) for s in stragglers}
    if len(ranks) > 1 and 2 * len(ranks) > world_size:
        return []  # job-wide: most of the job straggles
    return [
        s
        for s in stragglers
        if s.get("cause") in COUNTED_CAUSES
        and s.get("host")
        and int(s["rank"]) >= 0
        and not (s.get("cause") == HOST_WORK and int(s["rank"]) == 0)
    ]


def shares(stragglers: Sequence[dict[str, Any]], job_slowdown: float | None) -> list[float]:
    """Each straggler's share of the job's lost time: its S_w − 1 over the job's S − 1 (or over
    the stragglers' sum, when that is larger), so the shares never add up past the whole."""
    excess = [max(0.0, float(s.get("slowdown") or 1.0) - 1.0) for s in stragglers]
    whole = max((job_slowdown or 1.0) - 1.0, sum(excess))
    return [e / whole if whole > 0 else 0.0 for e in excess]


def record(
    session: Session,
    *,
    job: Job,
    result: AnalysisResult,
    now: float,
    agents: Sequence[RankAgent] | None = None,
) -> set[str]:
    """Hosts of the job attempt, its straggler incidents and its GPUs' new health events stored;
    returns the hosts whose figures changed. `agents`: the job attempt's agents as the analysis
    read them (queries.rank_agents), else read here: the rollups then describe the agents the
    stored analysis saw."""
    if agents is None:
        agents = queries.rank_agents(session=session, job=job)
    touched, rows = _host_jobs(session, job, agents)
    if not result.flagged:
        touched |= _incidents(session, job, result, agents, now)
    touched |= _gpu_events(session, job, agents, rows)
    return touched


def _host_jobs(session: Session, job: Job, agents: Sequence[RankAgent]) -> tuple[set[str], list[HostJob]]:
    """The hosts whose rows changed, and the job attempt's host rows (brought up to date). A
    host's `last_seen` moves in steps of LAST_SEEN_STEP: every pass moved it on every host of
    every running job, and each move rewrote the host's row and its stored figures (a pass over
    a 16,384-rank job: 2,048 hosts refreshed, ~0.7 s of the server's CPU, every 10 s)."""
    by_host: dict[str, list[RankAgent]] = {}
    for a in agents:
        if a.host:
            by_host.setdefault(a.host, []).append(a)
    stored = {
        r.host: r
        for r in session.scalars(
            select(HostJob).where(HostJob.job_id == job.job_id, HostJob.attempt == job.attempt)
        )
    }
    touched = set()
    for host, members in by_host.items():
        ranks, gpus = len(members), sorted({a.gpu_uuid for a in members if a.gpu_uuid})
        first, last = min(a.first_seen for a in members), max(a.last_seen for a in members)
        row = stored.get(host)
        if row is None:
            row = stored[host] = HostJob(
                host=host, job_id=job.job_id, attempt=job.attempt, gpu_scanned_until=None
            )
            session.add(row)
        same = row.ranks == ranks and row.gpus == gpus and row.first_seen == first
        if same and last < row.last_seen + LAST_SEEN_STEP:
            continue
        row.ranks, row.gpus, row.first_seen, row.last_seen = ranks, gpus, first, last
        touched.add(host)
    return touched, list(stored.values())


def _incidents(
    session: Session, job: Job, result: AnalysisResult, agents: Sequence[RankAgent], now: float
) -> set[str]:
    summary = result.summary or {}
    counted = blamed(summary.get("stragglers") or [], job.world_size)
    if not counted or result.window_start is None or result.window_end is None:
        return set()
    by_rank = {a.rank: a for a in agents}
    stored = {
        r.rank: r
        for r in session.scalars(
            select(HostIncident).where(
                HostIncident.job_id == job.job_id,
                HostIncident.attempt == job.attempt,
                HostIncident.rank.in_([int(s["rank"]) for s in counted]),
            )
        )
    }
    touched = set()
    for s, share in zip(counted, shares(counted, result.slowdown), strict=True):
        rank = int(s["rank"])
        agent = by_rank.get(rank)
        row = stored.get(rank)
        if row is None:
            row = HostIncident(
                job_id=job.job_id,
                attempt=job.attempt,
                rank=rank,
                first_seen=result.window_start,
                last_seen=result.window_end,
                slowdown=0.0,
            )
            session.add(row)
        slowdown = float(s.get("slowdown") or 1.0)
        if slowdown >= row.slowdown:  # the worst pass's numbers and words stand
            row.slowdown = slowdown
            row.cause = str(s.get("cause"))[:32]
            row.evidence = dict(s.get("evidence") or {})
            row.job_slowdown = result.slowdown
        row.host = str(s["host"])[:256]
        row.gpu_uuid = agent.gpu_uuid if agent is not None else ""
        row.dp_rank = s.get("dp_rank")
        row.stage = s.get("stage")
        row.gpu_hours_lost = max(row.gpu_hours_lost or 0.0, job.gpu_hours_wasted * share)
        row.first_seen = min(row.first_seen, result.window_start)
        row.last_seen = max(row.last_seen, result.window_end)
        row.computed_at = now
        touched.add(row.host)
    return touched


def _gpu_events(session: Session, job: Job, agents: Sequence[RankAgent], rows: Sequence[HostJob]) -> set[str]:
    """The job attempt's NVML samples since the last scan turned into events on their hosts
    (`rows`: the job attempt's host rows, as _host_jobs left them)."""
    if not rows:
        return set()
    since, until = queries.attempt_span(session=session, job=job)
    scanned = min((r.gpu_scanned_until for r in rows if r.gpu_scanned_until is not None), default=None)
    stmt = select(GpuSample).where(GpuSample.job_id == job.job_id)
    lower = max((t for t in (since, scanned) if t is not None), default=None)
    if lower is not None:
        stmt = stmt.where(GpuSample.time >= lower)
    if until is not None:
        stmt = stmt.where(GpuSample.time < until)
    samples = session.scalars(stmt.order_by(GpuSample.time).limit(MAX_SAMPLES_PER_PASS)).all()
    if not samples:
        return set()
    hosts = {a.rank: a.host for a in agents}
    per_gpu: dict[tuple[int, int], list[GpuSample]] = {}
    for s in samples:
        per_gpu.setdefault((s.rank, s.gpu_index), []).append(s)
    firsts = {
        s[0].gpu_uuid for s in per_gpu.values() if s[0].gpu_uuid and (scanned is None or s[0].time > scanned)
    }
    known = _known_ecc(session, firsts)
    touched = set()
    for (rank, _), series in per_gpu.items():
        host = hosts.get(rank, "")
        if not host:
            continue
        readings = [_reading(s) for s in series]
        previous = None
        if scanned is not None and readings[0].time <= scanned:
            previous, readings = readings[0], [r for r in readings[1:] if r.time > scanned]
        for e in derive(readings, previous=previous, known_ecc=known):
            session.add(
                HostGpuEvent(
                    host=host,
                    gpu_uuid=e.gpu_uuid,
                    job_id=job.job_id,
                    rank=rank,
                    kind=e.kind,
                    time=e.time,
                    code=e.code,
                    reason=e.reason,
                    value=e.value,
                    total=e.total,
                )
            )
            touched.add(host)
    newest = samples[-1].time
    for r in rows:
        r.gpu_scanned_until = newest
    return touched


def _reading(s: GpuSample) -> Reading:
    return Reading(
        time=s.time,
        gpu_uuid=s.gpu_uuid,
        throttle_reasons=s.throttle_reasons,
        ecc_uncorrected=s.ecc_uncorrected,
        xid_events=[int(x) for x in s.xid_events or []],
    )


def _known_ecc(session: Session, uuids: set[str]) -> dict[str, int]:
    """The last uncorrectable-ECC counter recorded per GPU: a GPU's count is new only once."""
    if not uuids:
        return {}
    stmt = (
        select(HostGpuEvent.gpu_uuid, func.max(HostGpuEvent.total))
        .where(HostGpuEvent.kind == "ecc_uncorrected", HostGpuEvent.gpu_uuid.in_(sorted(uuids)))
        .group_by(HostGpuEvent.gpu_uuid)
    )
    return {str(u): int(t) for u, t in session.execute(stmt) if t is not None}
