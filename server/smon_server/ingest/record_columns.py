"""A batch's step records as columns, from either wire form, before they are checked.

Agents send step records as `StepRecord` messages or, once the server says it reads them, as one
`StepTable` of little-endian arrays. Both become the same `RecordColumns`, so the checks in
validate.py run once, on arrays, whatever the form. From a table a column is one `np.frombuffer`:
no Python object per record or span, which is what the message form costs (issue 8: ~13 µs a
record spent reading protobuf fields one attribute at a time).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from smon.v1 import ingest_pb2 as pb
from smon_server.columns import spans_from_phases
from smon_server.store import codec

# (count, max_len, tokens, sum_sq) of a step, and (microbatch, count, max_len, tokens, sum_sq)
SeqRow = tuple[int, int, int, float]
MicrobatchRow = tuple[int, int, int, int, float]


class MalformedTable(ValueError):
    """A StepTable whose columns do not fit together (lengths, kind indexes): none of it is usable."""


@dataclass
class RecordColumns:
    step: np.ndarray  # int64 [records]
    start: np.ndarray  # float64, agent clock
    end: np.ndarray
    duration: np.ndarray
    gc_count: np.ndarray  # int64
    gc_seconds: np.ndarray
    span_count: np.ndarray  # int64: spans the record sent (phase-derived ones not counted)
    span_record: np.ndarray  # int64 [spans]
    span_kind: np.ndarray  # int64, index into kinds
    span_start: np.ndarray  # float64, seconds from the record's start
    span_duration: np.ndarray
    span_microbatch: np.ndarray  # int64, -1: none
    span_chunk: np.ndarray  # int64
    # A device-timed span's host view, seconds from the record's start (NaN: none, or unusable)
    span_host_start: np.ndarray
    span_host_duration: np.ndarray
    kinds: list[str]
    # Per-record findings of the form that only it can see (phase values, micro-batch rows).
    non_finite: np.ndarray  # bool [records]
    negative: np.ndarray
    over: np.ndarray  # float64 [records]: the largest phase value (checked against the limit)
    bad_name: np.ndarray
    bad_span: np.ndarray
    sum_sq: np.ndarray  # float64 [records], the step's Σ len² (0 without)
    seq: list[SeqRow | None]
    microbatch_seq: list[Sequence[MicrobatchRow]]

    def __len__(self) -> int:
        return int(self.step.shape[0])

    @staticmethod
    def concat(a: RecordColumns, b: RecordColumns) -> RecordColumns:
        """`a`'s records, then `b`'s (b's kinds renumbered into a's list)."""
        if not len(b):
            return a
        if not len(a):
            return b
        kinds = list(dict.fromkeys(a.kinds + b.kinds))
        remap = np.array([kinds.index(k) for k in b.kinds], dtype=np.int64)
        out: dict[str, Any] = {}
        for field in fields(RecordColumns):
            x, y = getattr(a, field.name), getattr(b, field.name)
            if field.name == "kinds":
                out[field.name] = kinds
            elif field.name == "span_kind":
                out[field.name] = np.r_[x, remap[y]] if y.size else x
            elif field.name == "span_record":
                out[field.name] = np.r_[x, y + len(a)]
            elif isinstance(x, list):
                out[field.name] = x + y
            else:
                out[field.name] = np.r_[x, y]
        return RecordColumns(**out)


def from_rows(records: Sequence[pb.StepRecord]) -> RecordColumns:
    """The message form. Records that report phase totals but no spans get their phases laid end
    to end as spans (a client without span timing)."""
    n = len(records)
    if n == 0:  # batches that carry a StepTable have no messages
        return _empty()
    step = np.array([r.step for r in records], dtype=np.int64)
    start = np.array([r.start_time for r in records], dtype=np.float64)
    span_lists = [r.spans for r in records]
    spans = [s for listed in span_lists for s in listed]
    span_count = np.array([len(listed) for listed in span_lists], dtype=np.int64)
    span_record = np.repeat(np.arange(n, dtype=np.int64), span_count)
    s_start = np.array([s.start for s in spans], dtype=np.float64)
    s_duration = np.array([s.duration for s in spans], dtype=np.float64)
    s_microbatch = np.array([s.microbatch if s.HasField("microbatch") else -1 for s in spans], dtype=np.int64)
    s_chunk = np.array([s.chunk for s in spans], dtype=np.int64)
    s_kinds = [s.kind for s in spans]
    s_host_start = np.array(
        [s.host_start if s.HasField("host_start") else np.nan for s in spans], dtype=np.float64
    )
    s_host_duration = np.array(
        [s.host_duration if s.HasField("host_duration") else np.nan for s in spans], dtype=np.float64
    )
    phase_maps = [r.phases for r in records]
    phase_names = [k for p in phase_maps for k in p]  # iterating the map itself stays in C
    phase_record = np.repeat(np.arange(n), [len(p) for p in phase_maps])
    p_values = np.array([p[k] for p in phase_maps for k in p], dtype=np.float64)

    def any_per_record(flags: np.ndarray, owner: np.ndarray) -> np.ndarray:
        return np.bincount(owner[flags], minlength=n) > 0

    over = np.zeros(n, dtype=np.float64)
    if p_values.size:
        np.maximum.at(over, phase_record, np.nan_to_num(p_values, nan=0.0, posinf=0.0, neginf=0.0))
    bad_name = any_per_record(np.array([not good_name(k) for k in phase_names], dtype=bool), phase_record)

    # A sub-message is a new Python object on every access: touch `seq` only where it is set.
    seq: list[SeqRow | None] = [None] * n
    sum_sq = np.zeros(n, dtype=np.float64)
    microbatch_seq: list[Sequence[MicrobatchRow]] = [[] for _ in range(n)]
    for i, record in enumerate(records):
        if record.HasField("seq"):
            q = record.seq
            seq[i] = (q.count, q.max_len, q.tokens, q.sum_sq)
            sum_sq[i] = q.sum_sq
        if len(record.microbatch_seq):
            microbatch_seq[i] = [
                (m.microbatch, m.seq.count, m.seq.max_len, m.seq.tokens, m.seq.sum_sq)
                for m in record.microbatch_seq
            ]

    kinds = list(dict.fromkeys(s_kinds))
    kind_index = {k: i for i, k in enumerate(kinds)}
    kind = [kind_index[k] for k in s_kinds]
    s_start = s_start - start[span_record]
    s_host_start = s_host_start - start[span_record]
    extra = [
        (i, kind_index.setdefault(k, len(kind_index)), a, d)
        for i in np.flatnonzero(span_count == 0).tolist()
        for k, a, d, _, _ in spans_from_phases(phase_maps[i])
    ]
    kinds = list(kind_index)
    if extra:
        e_record, e_kind, e_start, e_duration = (np.array(c) for c in zip(*extra, strict=True))
        span_record = np.r_[span_record, e_record.astype(np.int64)]
        kind += e_kind.astype(np.int64).tolist()
        s_start = np.r_[s_start, e_start.astype(np.float64)]
        s_duration = np.r_[s_duration, e_duration.astype(np.float64)]
        s_microbatch = np.r_[s_microbatch, np.full(len(extra), -1, np.int64)]
        s_chunk = np.r_[s_chunk, np.zeros(len(extra), np.int64)]
        s_host_start = np.r_[s_host_start, np.full(len(extra), np.nan)]
        s_host_duration = np.r_[s_host_duration, np.full(len(extra), np.nan)]
    mb_bad_span, mb_non_finite = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    if any(microbatch_seq):
        rows = [row for listed in microbatch_seq for row in listed]
        mb_bad_span, mb_non_finite = _microbatch_row_flags(
            np.repeat(np.arange(n), [len(listed) for listed in microbatch_seq]),
            np.array([row[0] for row in rows], dtype=np.int64),
            np.array([row[4] for row in rows], dtype=np.float64),
            n,
        )
    return RecordColumns(
        step=step,
        start=start,
        end=np.array([r.end_time for r in records], dtype=np.float64),
        duration=np.array([r.duration for r in records], dtype=np.float64),
        gc_count=np.array([r.gc_count for r in records], dtype=np.int64),
        gc_seconds=np.array([r.gc_seconds for r in records], dtype=np.float64),
        span_count=span_count,
        span_record=span_record,
        span_kind=np.asarray(kind, dtype=np.int64),
        span_start=s_start,
        span_duration=s_duration,
        span_microbatch=s_microbatch,
        span_chunk=s_chunk,
        **_host_views(s_host_start, s_host_duration),
        kinds=kinds,
        non_finite=any_per_record(~np.isfinite(p_values), phase_record) | mb_non_finite,
        negative=any_per_record(p_values < 0, phase_record),
        over=over,
        bad_name=bad_name,
        bad_span=mb_bad_span,
        sum_sq=sum_sq,
        seq=seq,
        microbatch_seq=microbatch_seq,
    )


@functools.cache
def _empty() -> RecordColumns:
    """No records: the same arrays every time (nothing changes them)."""
    f8, i8, no = np.zeros(0, np.float64), np.zeros(0, np.int64), np.zeros(0, bool)
    return RecordColumns(
        step=i8, start=f8, end=f8, duration=f8, gc_count=i8, gc_seconds=f8, span_count=i8,
        span_record=i8, span_kind=i8, span_start=f8, span_duration=f8, span_microbatch=i8,
        span_chunk=i8, span_host_start=f8, span_host_duration=f8, kinds=[], non_finite=no,
        negative=no, over=f8, bad_name=no, bad_span=no,
        sum_sq=f8, seq=[], microbatch_seq=[],
    )  # fmt: skip


def _microbatch_row_flags(
    owner: np.ndarray, microbatch: np.ndarray, sum_sq: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per record: a micro-batch sequence row whose number is past what its packed row holds
    (bad_span), and one whose Σ len² is NaN, infinite or negative (non_finite). One check for
    both wire forms (tests/ingest/test_wire_forms.py runs every case through each)."""
    out_of_range = (microbatch < codec.MIN_SEQ_MICROBATCH) | (microbatch > codec.MAX_MICROBATCH)
    bad_sum = ~np.isfinite(sum_sq) | (sum_sq < 0)
    return (
        np.bincount(owner[out_of_range], minlength=n) > 0,
        np.bincount(owner[bad_sum], minlength=n) > 0,
    )


MAX_NAME_LENGTH = 128


def _host_views(host_start: np.ndarray, host_duration: np.ndarray) -> dict[str, np.ndarray]:
    """A span's host view is a hint beside its device timing: one that is not finite or runs
    backwards is dropped (both halves NaN) and the span kept as timed on the device."""
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(host_start) & np.isfinite(host_duration) & (host_duration >= 0)
    return {
        "span_host_start": np.where(usable, host_start, np.nan),
        "span_host_duration": np.where(usable, host_duration, np.nan),
    }


def good_name(name: str) -> bool:
    return bool(name) and len(name) <= MAX_NAME_LENGTH and "\x00" not in name


def _column(
    table: pb.StepTable, name: str, dtype: str, n: int, *, optional: bool = False
) -> np.ndarray | None:
    raw = getattr(table, name)
    if optional and not raw:
        return None
    item = np.dtype(dtype).itemsize
    if len(raw) != n * item:
        raise MalformedTable(f"{name}: {len(raw)} bytes for {n} entries of {item}")
    return np.frombuffer(raw, dtype=dtype)


def from_table(table: pb.StepTable) -> RecordColumns:
    """The table form: each column one array view, its length checked against the others."""
    n = table.records

    def need(name: str, dtype: str, count: int) -> np.ndarray:
        column = _column(table, name, dtype, count)
        assert column is not None
        return column

    span_count = need("span_count", "<u4", n).astype(np.int64)
    m = int(span_count.sum())
    kind = need("span_kind", "<u2", m).astype(np.int64)
    if m and int(kind.max()) >= len(table.kinds):
        raise MalformedTable(f"span_kind {int(kind.max())} past the {len(table.kinds)} kinds")
    microbatch = _column(table, "span_microbatch", "<i4", m, optional=True)
    chunk = _column(table, "span_chunk", "<i4", m, optional=True)
    host_start = _column(table, "span_host_start", "<f8", m, optional=True)
    host_duration = _column(table, "span_host_duration", "<f8", m, optional=True)
    span_record = np.repeat(np.arange(n, dtype=np.int64), span_count)
    start = need("start_time", "<f8", n).astype(np.float64)

    seq: list[SeqRow | None] = [None] * n
    sum_sq = np.zeros(n, dtype=np.float64)
    seq_count = _column(table, "seq_count", "<u4", n, optional=True)
    if seq_count is not None:
        tokens = need("seq_tokens", "<u8", n)
        sum_sq = need("seq_sum_sq", "<f8", n).astype(np.float64)
        max_len = need("seq_max_len", "<u4", n)
        for i in np.flatnonzero(seq_count).tolist():
            seq[i] = (int(seq_count[i]), int(max_len[i]), int(tokens[i]), float(sum_sq[i]))
    microbatch_seq: list[Sequence[MicrobatchRow]] = [()] * n  # most tables have no rows
    bad_span = non_finite = np.zeros(n, dtype=bool)
    mb_rows = _column(table, "mb_rows", "<u4", n, optional=True)
    if mb_rows is not None:
        per_record: list[list[MicrobatchRow]] = [[] for _ in range(n)]
        microbatch_seq = list(per_record)  # the same lists, filled below
        k = int(mb_rows.sum())
        columns = [
            need(name, dtype, k)
            for name, dtype in (
                ("mb_microbatch", "<i4"),
                ("mb_count", "<u4"),
                ("mb_max_len", "<u4"),
                ("mb_tokens", "<u8"),
                ("mb_sum_sq", "<f8"),
            )
        ]
        owner = np.repeat(np.arange(n), mb_rows)
        rows = list(zip(*(c.tolist() for c in columns), strict=True))
        for i, row in zip(owner.tolist(), rows, strict=True):
            per_record[i].append(row)
        bad_span, non_finite = _microbatch_row_flags(owner, columns[0].astype(np.int64), columns[4], n)
    return RecordColumns(
        step=need("step", "<i8", n).astype(np.int64),
        start=start,
        end=need("end_time", "<f8", n).astype(np.float64),
        duration=need("duration", "<f8", n).astype(np.float64),
        gc_count=need("gc_count", "<u4", n).astype(np.int64),
        gc_seconds=need("gc_seconds", "<f8", n).astype(np.float64),
        span_count=span_count,
        span_record=span_record,
        span_kind=kind,
        span_start=need("span_start", "<f8", m).astype(np.float64) - start[span_record],
        span_duration=need("span_duration", "<f8", m).astype(np.float64),
        span_microbatch=np.full(m, -1, np.int64) if microbatch is None else microbatch.astype(np.int64),
        span_chunk=np.zeros(m, np.int64) if chunk is None else chunk.astype(np.int64),
        **_host_views(
            np.full(m, np.nan) if host_start is None else host_start.astype(np.float64) - start[span_record],
            np.full(m, np.nan) if host_duration is None else host_duration.astype(np.float64),
        ),
        kinds=list(table.kinds),
        non_finite=non_finite,
        negative=np.zeros(n, dtype=bool),
        over=np.zeros(n, dtype=np.float64),
        bad_name=np.zeros(n, dtype=bool),
        bad_span=bad_span,
        sum_sq=sum_sq,
        seq=seq,
        microbatch_seq=microbatch_seq,
    )
