"""Step records as one StepTable (columns of little-endian arrays), in the shipper process.

A server reads a table's columns with one array view each instead of a Python object per record
and span (docs/storage.md, "Ingest"), so a batch costs it a few microseconds, not ~13 µs a record.
Built with the standard library's `array` (the agent imports no numpy). Records with phase totals
but no spans are not tables' business: they stay StepRecord messages.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from smon.v1 import ingest_pb2 as pb

_SWAP = sys.byteorder != "little"
# Phases the server derives from a record itself, never lays out as spans: `other` (the step no
# span covers) and `gc` (pauses inside other phases).
_DERIVED = frozenset({"other", "gc"})
_NAN = float("nan")


def _bytes(typecode: str, values: Sequence[float] | Sequence[int]) -> bytes:
    column = array(typecode, values)
    if _SWAP:
        column.byteswap()
    return column.tobytes()


def in_table(record: pb.StepRecord) -> bool:
    """Whether a record travels in a table: its phases, if any, are its spans' (the server derives
    them); phase totals without spans stay a message, which the server lays out as spans."""
    return len(record.spans) > 0 or all(name in _DERIVED for name in record.phases)


def to_table(records: Sequence[pb.StepRecord]) -> pb.StepTable:
    """The records as columns, in order (the server's rejection indexes follow this order)."""
    kinds: dict[str, int] = {}
    span_kind: list[int] = []
    span_start: list[float] = []
    span_duration: list[float] = []
    span_microbatch: list[int] = []
    span_chunk: list[int] = []
    span_host: list[float] = []
    span_host_start: list[float] = []
    per_microbatch = chunked = host_timed = False
    for record in records:
        for span in record.spans:
            span_kind.append(kinds.setdefault(span.kind, len(kinds)))
            span_start.append(span.start)
            span_duration.append(span.duration)
            if span.HasField("microbatch"):
                per_microbatch = True
                span_microbatch.append(span.microbatch)
            else:
                span_microbatch.append(-1)
            chunked = chunked or span.chunk != 0
            span_chunk.append(span.chunk)
            if span.HasField("host_duration"):
                host_timed = True
                span_host.append(span.host_duration)
                span_host_start.append(span.host_start if span.HasField("host_start") else _NAN)
            else:
                span_host.append(_NAN)
                span_host_start.append(_NAN)
    table = pb.StepTable(
        records=len(records),
        step=_bytes("q", [r.step for r in records]),
        start_time=_bytes("d", [r.start_time for r in records]),
        end_time=_bytes("d", [r.end_time for r in records]),
        duration=_bytes("d", [r.duration for r in records]),
        gc_count=_bytes("I", [r.gc_count for r in records]),
        gc_seconds=_bytes("d", [r.gc_seconds for r in records]),
        span_count=_bytes("I", [len(r.spans) for r in records]),
        kinds=list(kinds),
        span_kind=_bytes("H", span_kind),
        span_start=_bytes("d", span_start),
        span_duration=_bytes("d", span_duration),
    )
    if per_microbatch:
        table.span_microbatch = _bytes("i", span_microbatch)
    if chunked:
        table.span_chunk = _bytes("i", span_chunk)
    if host_timed:
        table.span_host_duration = _bytes("d", span_host)
        table.span_host_start = _bytes("d", span_host_start)
    with_seq = [r.seq if r.HasField("seq") else None for r in records]
    if any(q is not None for q in with_seq):
        table.seq_count = _bytes("I", [q.count if q is not None else 0 for q in with_seq])
        table.seq_tokens = _bytes("Q", [q.tokens if q is not None else 0 for q in with_seq])
        table.seq_sum_sq = _bytes("d", [q.sum_sq if q is not None else 0.0 for q in with_seq])
        table.seq_max_len = _bytes("I", [q.max_len if q is not None else 0 for q in with_seq])
    if any(len(r.microbatch_seq) for r in records):
        rows = [m for r in records for m in r.microbatch_seq]
        table.mb_rows = _bytes("I", [len(r.microbatch_seq) for r in records])
        table.mb_microbatch = _bytes("i", [m.microbatch for m in rows])
        table.mb_count = _bytes("I", [m.seq.count for m in rows])
        table.mb_tokens = _bytes("Q", [m.seq.tokens for m in rows])
        table.mb_sum_sq = _bytes("d", [m.seq.sum_sq for m in rows])
        table.mb_max_len = _bytes("I", [m.seq.max_len for m in rows])
    return table
