"""Step rows in PostgreSQL's binary COPY format, built from a batch's columns with array operations.

At 100,000 records a second the server cannot spend a Python call per value: psycopg's
`write_row` dumps each value through its type adapters (~3 µs a row), a text line per row in an
f-string still ~2 µs. Here the fixed-width part of every row is one structured array, and each
row's variable-width byte strings (spans, sequence statistics) are scattered next to it with one
fancy-index assignment, so a batch of records costs a few dozen numpy calls.

Format (PostgreSQL docs, "COPY", binary format): a signature header, then per row an int16 field
count and per field an int32 byte length (-1: NULL) and the value in network byte order; a -1
int16 trailer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
TRAILER = (-1).to_bytes(2, "big", signed=True)

# step_records in STEP_COLUMNS order: the fixed-width columns, each with its length word.
_FIXED = np.dtype(
    [
        ("fields", ">i2"),
        ("job_key_len", ">i4"), ("job_key", ">i4"),
        ("step_len", ">i4"), ("step", ">i8"),
        ("rank_len", ">i4"), ("rank", ">i4"),
        ("start_len", ">i4"), ("start_time", ">f8"),
        ("duration_len", ">i4"), ("duration", ">f4"),
        ("agent_key_len", ">i4"), ("agent_key", ">i4"),
        ("gc_count_len", ">i4"), ("gc_count", ">i2"),
        ("gc_seconds_len", ">i4"), ("gc_seconds", ">f4"),
    ]
)  # fmt: skip
FIELDS = 11  # the eight above and three bytea: spans, seq_total, seq_microbatches


def _var_column(values: Sequence[bytes | None]) -> tuple[np.ndarray, bytes]:
    """(byte length per row, -1 for NULL; the non-NULL values concatenated)."""
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
    return lengths, b"".join(v for v in values if v is not None)


def step_rows(
    *,
    job_key: int,
    agent_key: int,
    rank: int,
    step: np.ndarray,
    start_time: np.ndarray,
    duration: np.ndarray,
    gc_count: np.ndarray,
    gc_seconds: np.ndarray,
    spans: bytes,
    span_bytes: np.ndarray,
    seq_total: Sequence[bytes | None],
    seq_microbatches: Sequence[bytes | None],
) -> bytes:
    """One batch's rows (no header or trailer). `spans` holds every row's spans back to back,
    `span_bytes` how many bytes of it each row takes."""
    n = int(step.shape[0])
    if n == 0:
        return b""
    fixed = np.empty(n, dtype=_FIXED)
    fixed["fields"] = FIELDS
    for name, size, values in (
        ("job_key", 4, job_key),
        ("step", 8, step),
        ("rank", 4, rank),
        ("start", 8, start_time),
        ("duration", 4, duration),
        ("agent_key", 4, agent_key),
        ("gc_count", 2, gc_count),
        ("gc_seconds", 4, gc_seconds),
    ):
        fixed[f"{name}_len"] = size
        fixed["start_time" if name == "start" else name] = values
    seq_len, seq_data = _var_column(seq_total)
    mb_len, mb_data = _var_column(seq_microbatches)
    var_lengths = [span_bytes.astype(np.int64), seq_len, mb_len]
    var_data = [
        np.frombuffer(spans, np.uint8),
        np.frombuffer(seq_data, np.uint8),
        np.frombuffer(mb_data, np.uint8),
    ]

    # Each row: the fixed part, then per bytea its length word and its bytes.
    row_size = _FIXED.itemsize + sum(4 + np.maximum(lengths, 0) for lengths in var_lengths)
    row_start = np.zeros(n, dtype=np.int64)
    np.cumsum(row_size[:-1], out=row_start[1:])
    out = np.empty(int(row_size.sum()), dtype=np.uint8)
    out[(row_start[:, None] + np.arange(_FIXED.itemsize)).ravel()] = np.frombuffer(fixed.tobytes(), np.uint8)
    at = row_start + _FIXED.itemsize
    for lengths, data in zip(var_lengths, var_data, strict=True):
        words = lengths.astype(">i4").view(np.uint8).reshape(n, 4)
        out[(at[:, None] + np.arange(4)).ravel()] = words.ravel()
        at = at + 4
        size = np.maximum(lengths, 0)
        if data.size:
            # Byte k of the concatenation goes to its row's slot: the slot's start, plus k minus
            # where that row's bytes start in the concatenation.
            src_start = np.zeros(n, dtype=np.int64)
            np.cumsum(size[:-1], out=src_start[1:])
            owner = np.repeat(np.arange(n), size)
            out[at[owner] + np.arange(data.size) - src_start[owner]] = data
        at = at + size
    return out.tobytes()
