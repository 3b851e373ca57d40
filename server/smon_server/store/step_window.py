"""Read a window of a job's step records as columns (smon_server.columns.StepColumns).

A 4,096-rank × 500-step window is two million records: fetched as rows, Python objects alone
would take longer than the analysis. On PostgreSQL the database concatenates the window into a
few byte strings (a fixed-width header per record, made with the `*send` functions, plus the
records' packed spans and sequence statistics, which are fixed-width rows already), and numpy
reads them with `frombuffer`: no Python object per record or span. SQLite, for small embedded
set-ups, fetches rows.

A rank that re-ran a step after a restart has two records of it; the newest run is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from smon_server.columns import StepColumns
from smon_server.store import codec
from smon_server.store.kinds import kind_names
from smon_server.store.models import Agent, Job, StepRecord

# One header per record, as PostgreSQL's *send functions write it (network byte order).
_HEADER = np.dtype(
    [
        ("rank", ">i4"),
        ("step", ">i8"),
        ("start_time", ">f8"),
        ("duration", ">f4"),
        ("agent_key", ">i4"),
        ("gc_count", ">i2"),
        ("gc_seconds", ">f4"),
        ("spans", ">i4"),
        ("seq_total", ">i4"),
        ("seq_microbatches", ">i4"),
        ("span_host", ">i4"),
    ]
)
# Ranks per query: keeps each concatenated string far below PostgreSQL's 1 GB value limit.
RANKS_PER_QUERY = 1024

# Fetched in binary (psycopg `binary=True`): the text protocol sends bytea as hex, which doubles
# the bytes and costs the client a hex decode (0.03 vs 0.005 CPU s per query of 1,024 ranks × 64
# steps, 32 queries a cold 4,096-rank window).
_PG_WINDOW = (
    "SELECT string_agg(int4send(rank) || int8send(step) || float8send(start_time)"
    " || float4send(duration) || int4send(agent_key) || int2send(gc_count) || float4send(gc_seconds)"
    " || int4send(length(spans)) || int4send(coalesce(length(seq_total), 0))"
    " || int4send(coalesce(length(seq_microbatches), 0)) || int4send(coalesce(length(span_host), 0)),"
    " ''::bytea), string_agg(spans, ''::bytea), string_agg(seq_total, ''::bytea),"
    " string_agg(seq_microbatches, ''::bytea), string_agg(span_host, ''::bytea)"
    " FROM step_records WHERE job_key = %(job)s AND step >= %(lo)s AND step <= %(hi)s"
    " AND rank >= %(rank_lo)s AND rank < %(rank_hi)s"
)


@dataclass
class _Raw:
    header: np.ndarray
    spans: bytes
    seq_total: bytes
    seq_microbatches: bytes
    span_host: bytes = b""


def read_window(
    *,
    session: Session,
    job: Job,
    from_step: int | None,
    to_step: int | None,
    rank: int | None = None,
) -> StepColumns:
    """The job's records of steps [from_step, to_step] (all when unset), of every rank or one,
    sorted by (rank, step)."""
    lo = from_step if from_step is not None else -(2**62)
    hi = to_step if to_step is not None else 2**62
    coords = session.execute(
        select(Agent.key, Agent.dp_rank, Agent.pp_rank, Agent.tp_rank, Agent.rank).where(
            Agent.job_id == job.job_id, Agent.attempt == job.attempt
        )
    ).all()
    if rank is not None:
        bounds = [(rank, rank + 1)]
    else:
        # RANKS_PER_QUERY of the ranks that report at a time, whatever they are numbered (a
        # world size a client declared, and ranks numbered far apart, must not make a query per
        # thousand numbers): the first range from 0, the last to the largest rank there is.
        ranks = sorted({int(c[4]) for c in coords})
        starts = [0, *ranks[RANKS_PER_QUERY::RANKS_PER_QUERY]]
        bounds = list(zip(starts, [*starts[1:], 2**31 - 1], strict=True))
    if session.get_bind().dialect.name == "postgresql":
        parts = [_read_pg(session, job.key, lo, hi, a, b) for a, b in bounds]
    else:
        parts = [_read_rows(session, job.key, lo, hi, a, b) for a, b in bounds]
    raw = _Raw(
        header=np.concatenate([p.header for p in parts]) if parts else np.zeros(0, dtype=_HEADER),
        spans=b"".join(p.spans for p in parts),
        seq_total=b"".join(p.seq_total for p in parts),
        seq_microbatches=b"".join(p.seq_microbatches for p in parts),
        span_host=b"".join(p.span_host for p in parts),
    )
    agents = np.array([c[:4] for c in coords], dtype=np.int64).reshape(-1, 4)
    return _newest_runs(_decode(raw, kind_names(session, job.key), agents))


def _read_pg(session: Session, job_key: int, lo: int, hi: int, rank_lo: int, rank_hi: int) -> _Raw:
    params = {"job": job_key, "lo": lo, "hi": hi, "rank_lo": rank_lo, "rank_hi": rank_hi}
    driver = session.connection().connection.driver_connection
    with driver.cursor(binary=True) as cursor:  # type: ignore[union-attr]
        cursor.execute(_PG_WINDOW, params)
        header, spans, seq_total, seq_mb, span_host = cursor.fetchone()
    return _Raw(
        header=np.frombuffer(header or b"", dtype=_HEADER),
        spans=bytes(spans or b""),
        seq_total=bytes(seq_total or b""),
        seq_microbatches=bytes(seq_mb or b""),
        span_host=bytes(span_host or b""),
    )


def _read_rows(session: Session, job_key: int, lo: int, hi: int, rank_lo: int, rank_hi: int) -> _Raw:
    r = StepRecord
    rows = session.execute(
        select(
            r.rank, r.step, r.start_time, r.duration, r.agent_key, r.gc_count, r.gc_seconds,
            r.spans, r.seq_total, r.seq_microbatches, r.span_host,
        ).where(r.job_key == job_key, r.step >= lo, r.step <= hi, r.rank >= rank_lo, r.rank < rank_hi)
    ).all()  # fmt: skip
    spans = [bytes(row[7]) for row in rows]
    totals = [bytes(row[8] or b"") for row in rows]
    microbatches = [bytes(row[9] or b"") for row in rows]
    hosts = [bytes(row[10] or b"") for row in rows]
    header = np.zeros(len(rows), dtype=_HEADER)
    for i, name in enumerate(
        ("rank", "step", "start_time", "duration", "agent_key", "gc_count", "gc_seconds")
    ):
        header[name] = [row[i] for row in rows]
    header["spans"] = [len(b) for b in spans]
    header["seq_total"] = [len(b) for b in totals]
    header["seq_microbatches"] = [len(b) for b in microbatches]
    header["span_host"] = [len(b) for b in hosts]
    return _Raw(header, b"".join(spans), b"".join(totals), b"".join(microbatches), b"".join(hosts))


def _decode(raw: _Raw, kinds: tuple[str, ...], coords: np.ndarray) -> StepColumns:
    h = raw.header
    n = h.shape[0]
    spans = codec.unpack_spans(raw.spans)
    totals = codec.unpack_seq_total(raw.seq_total)
    mbs = codec.unpack_seq_microbatches(raw.seq_microbatches)
    seq_sum_sq = np.zeros(n)
    has_total = h["seq_total"] > 0
    seq_sum_sq[has_total] = totals["sum_sq"]
    # Each record's dp / pp / tp ranks are its agent's.
    agent = h["agent_key"].astype(np.int64)
    order = np.argsort(coords[:, 0])
    at = np.clip(np.searchsorted(coords[order, 0], agent), 0, max(len(coords) - 1, 0))
    known = coords[order][at] if len(coords) else np.zeros((n, 4), dtype=np.int64)
    return StepColumns(
        kinds=kinds,
        rank=h["rank"].astype(np.int64),
        step=h["step"].astype(np.int64),
        dp_rank=known[:, 1].astype(np.int32),
        pp_rank=known[:, 2].astype(np.int32),
        tp_rank=known[:, 3].astype(np.int32),
        start_time=h["start_time"].astype(np.float64),
        duration=h["duration"].astype(np.float64),
        gc_count=h["gc_count"].astype(np.int32),
        gc_seconds=h["gc_seconds"].astype(np.float64),
        seq_sum_sq=seq_sum_sq,
        span_count=(h["spans"] // codec.SPAN.itemsize).astype(np.int64),
        span_kind=spans["kind"].astype(np.int32),
        span_start=spans["start"].astype(np.float64),
        span_duration=spans["duration"].astype(np.float64),
        span_microbatch=spans["microbatch"].astype(np.int32),
        span_chunk=spans["chunk"].astype(np.int32),
        mb_count=(h["seq_microbatches"] // codec.SEQ_MICROBATCH.itemsize).astype(np.int64),
        mb_index=mbs["microbatch"].astype(np.int32),
        mb_sum_sq=mbs["sum_sq"].astype(np.float64),
        **_host_views(raw, h, spans.shape[0]),
    )


def _host_views(raw: _Raw, h: np.ndarray, n_spans: int) -> dict[str, np.ndarray]:
    """The spans' host views (NaN for the spans of records that have none); nothing at all when
    no record has one, as for every CPU job."""
    if not raw.span_host:
        return {}
    views = np.frombuffer(raw.span_host, dtype=codec.SPAN_HOST)
    span_count = h["spans"] // codec.SPAN.itemsize
    has = h["span_host"] > 0
    owner = np.repeat(has, span_count)  # spans of records that have host views
    start, duration = np.full(n_spans, np.nan), np.full(n_spans, np.nan)
    if views.shape[0] != int(owner.sum()):  # a row whose views do not match its spans: none used
        return {}
    start[owner] = views["start"]
    duration[owner] = views["duration"]
    return {"span_host_start": start, "span_host_duration": duration}


def _newest_runs(cols: StepColumns) -> StepColumns:
    """Sorted by (rank, step); of records of one (rank, step), only the latest start's."""
    if not len(cols):
        return cols
    order = np.lexsort((cols.start_time, cols.step, cols.rank))
    rank, step = cols.rank[order], cols.step[order]
    last = np.r_[(rank[1:] != rank[:-1]) | (step[1:] != step[:-1]), True]
    keep = order[last]
    if keep.size == len(cols) and np.array_equal(keep, np.arange(keep.size)):
        return cols
    return cols.take(keep)
