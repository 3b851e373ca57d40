"""Step rows in PostgreSQL's binary COPY format, built from a group's columns with array operations.

At 100,000 records a second the server cannot spend a Python call per value: psycopg's
`write_row` dumps each value through its type adapters (~3 µs a row), a text line per row in an
f-string still ~2 µs. Rows of one layout (the same span count and the same sequence-statistics
sizes: in practice a batch has one or two layouts) are one structured array whose fields are the
row's bytes in order, length words included, so a whole group of records costs a few numpy
calls per layout, not per record or per byte. Rows go out layout by layout; COPY does not care
about their order.

Format (PostgreSQL docs, "COPY", binary format): a signature header, then per row an int16 field
count and per field an int32 byte length (-1: NULL) and the value in network byte order; a -1
int16 trailer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smon_server.store.codec import SPAN

HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
TRAILER = (-1).to_bytes(2, "big", signed=True)

# step_records in STEP_COLUMNS order: the fixed-width columns, each with its length word.
_FIXED = [
    ("fields", ">i2"),
    ("job_key_len", ">i4"), ("job_key", ">i4"),
    ("step_len", ">i4"), ("step", ">i8"),
    ("rank_len", ">i4"), ("rank", ">i4"),
    ("start_len", ">i4"), ("start_time", ">f8"),
    ("duration_len", ">i4"), ("duration", ">f4"),
    ("agent_key_len", ">i4"), ("agent_key", ">i4"),
    ("gc_count_len", ">i4"), ("gc_count", ">i2"),
    ("gc_seconds_len", ">i4"), ("gc_seconds", ">f4"),
]  # fmt: skip
FIELDS = 12  # the eight above and four bytea: spans, seq_total, seq_microbatches, span_host
_LENGTHS = {
    "job_key": 4, "step": 8, "rank": 4, "start_time": 8, "duration": 4, "agent_key": 4,
    "gc_count": 2, "gc_seconds": 4,
}  # fmt: skip
_VAR = ("spans", "seq_total", "seq_microbatches", "span_host")
_WIDE = 1 << 21


def _lengths(values: Sequence[bytes | None]) -> np.ndarray:
    """Byte length per value, -1 for NULL (all NULL, the usual case, without a Python loop)."""
    if values.count(None) == len(values):
        return np.full(len(values), -1, dtype=np.int64)
    return np.fromiter((-1 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))


def _layout(span_bytes: int, seq_bytes: int, microbatch_bytes: int, host_bytes: int) -> np.dtype:
    """A row's bytes as one structured dtype: the fixed part, then each bytea's length word and
    its bytes (none when NULL or empty)."""
    fields = list(_FIXED)
    for name, size in zip(_VAR, (span_bytes, seq_bytes, microbatch_bytes, host_bytes), strict=True):
        fields.append((f"{name}_len", ">i4"))
        if size > 0:
            fields.append((name, f"V{size}"))
    return np.dtype(fields)


def step_rows(
    *,
    job_key: int | np.ndarray,
    agent_key: int | np.ndarray,
    rank: int | np.ndarray,
    step: np.ndarray,
    start_time: np.ndarray,
    duration: np.ndarray,
    gc_count: np.ndarray,
    gc_seconds: np.ndarray,
    spans: bytes,
    span_bytes: np.ndarray,
    seq_total: Sequence[bytes | None],
    seq_microbatches: Sequence[bytes | None],
    span_host: Sequence[bytes | None] | None = None,
) -> bytes:
    """Rows (no header or trailer). `spans` holds every row's spans back to back (codec.SPAN
    records), `span_bytes` how many bytes of it each row takes; the keys and the rank are one
    value for all rows or one per row."""
    n = int(step.shape[0])
    if n == 0:
        return b""
    fixed = {
        "job_key": job_key, "step": step, "rank": rank, "start_time": start_time, "duration": duration,
        "agent_key": agent_key, "gc_count": gc_count, "gc_seconds": gc_seconds,
    }  # fmt: skip
    per_row = {name: np.broadcast_to(np.asarray(v), (n,)) for name, v in fixed.items()}
    span_bytes = np.asarray(span_bytes, dtype=np.int64)
    span_records = np.frombuffer(spans, dtype=SPAN)
    first_span = np.zeros(n, dtype=np.int64)
    np.cumsum(span_bytes[:-1] // SPAN.itemsize, out=first_span[1:])
    span_host = span_host if span_host is not None else [None] * n
    seq_len, mb_len, host_len = _lengths(seq_total), _lengths(seq_microbatches), _lengths(span_host)
    # One integer per layout, so finding the layouts is a sort of integers (or nothing, when all
    # rows agree); lengths past 2**21 bytes (not seen in practice), and device-timed records'
    # host views (GPU jobs), take the slower row-wise unique.
    layouts: list[tuple[int, ...]]
    if max(int(span_bytes.max()), int(seq_len.max()), int(mb_len.max())) < _WIDE and int(host_len.max()) < 0:
        layout = (span_bytes << 42) | ((seq_len + 1) << 21) | (mb_len + 1)
        keys = layout[:1] if bool((layout == layout[0]).all()) else np.unique(layout)
        layouts = [(k >> 42, ((k >> 21) & (_WIDE - 1)) - 1, (k & (_WIDE - 1)) - 1, -1) for k in keys.tolist()]
        members = [np.arange(n)] if keys.size == 1 else [np.flatnonzero(layout == k) for k in keys]
    else:
        table = np.stack([span_bytes, seq_len, mb_len, host_len], axis=1)
        unique, which = np.unique(table, axis=0, return_inverse=True)
        layouts = [tuple(row) for row in unique.tolist()]
        members = [np.flatnonzero(which.reshape(-1) == i) for i in range(len(layouts))]
    out = []
    for (n_span_bytes, n_seq, n_mb, n_host), rows in zip(layouts, members, strict=True):
        part = np.empty(rows.size, dtype=_layout(n_span_bytes, n_seq, n_mb, n_host))
        part["fields"] = FIELDS
        for name, size in _LENGTHS.items():
            part[f"{'start' if name == 'start_time' else name}_len"] = size
            part[name] = per_row[name][rows]
        part["spans_len"] = n_span_bytes
        if n_span_bytes:
            count = n_span_bytes // SPAN.itemsize
            taken = span_records[first_span[rows][:, None] + np.arange(count)]
            part["spans"] = taken.view(f"V{n_span_bytes}").reshape(-1)
        for name, values, size in (
            ("seq_total", seq_total, n_seq),
            ("seq_microbatches", seq_microbatches, n_mb),
            ("span_host", span_host, n_host),
        ):
            part[f"{name}_len"] = size
            if size > 0:
                part[name] = np.frombuffer(b"".join(values[i] for i in rows.tolist()), dtype=f"V{size}")  # type: ignore[misc]
        out.append(part.tobytes())
    return b"".join(out)
