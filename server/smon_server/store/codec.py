"""The packed byte layouts of a step record's spans and sequence statistics (docs/storage.md).

Fixed-width little-endian rows, so a whole window decodes with one `np.frombuffer` per column
instead of a Python object per span. The layouts are part of the stored data: change them only
with a migration that rewrites the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# kind: span_kinds.code; start: seconds from the step's start (float32: relative error 6e-8,
# under 1 µs for steps up to 10 s); duration: seconds.
SPAN = np.dtype(
    [("kind", "<u2"), ("microbatch", "<i2"), ("chunk", "<u2"), ("start", "<f4"), ("duration", "<f4")]
)
SEQ_TOTAL = np.dtype([("count", "<u4"), ("max_len", "<u4"), ("tokens", "<u8"), ("sum_sq", "<f8")])
SEQ_MICROBATCH = np.dtype(
    [("microbatch", "<i4"), ("count", "<u4"), ("max_len", "<u4"), ("tokens", "<u8"), ("sum_sq", "<f8")]
)
# A device-timed span's host view (step_records.span_host, one row per span of the record, in the
# order of its `spans`): when the host issued it, from the step's start, and for how long; NaN
# where that span has none. Records without any are NULL (CPU jobs pay nothing).
SPAN_HOST = np.dtype([("start", "<f4"), ("duration", "<f4")])
assert SPAN.itemsize == 14 and SEQ_TOTAL.itemsize == 24 and SEQ_MICROBATCH.itemsize == 28

# What fits the packed fields, and the analysis's int16 columns (whatif/ops.py OpTable: chunk and
# micro-batch); ingest rejects spans outside (validate.py), in either wire form.
MAX_MICROBATCH = 32_767
MIN_SEQ_MICROBATCH = -32_768  # a micro-batch sequence row's number (its analysis key packs 16 bits)
MAX_CHUNK = 32_767
MAX_GC_COUNT = 32_767

# (kind code, start, duration, microbatch, chunk)
SpanTuple = tuple[int, float, float, int, int]
# (count, max_len, tokens, sum_sq) and (microbatch, count, max_len, tokens, sum_sq)
SeqTuple = tuple[int, int, int, float]
MicrobatchSeqTuple = tuple[int, int, int, int, float]


def pack_span_columns(
    kind: np.ndarray, microbatch: np.ndarray, chunk: np.ndarray, start: np.ndarray, duration: np.ndarray
) -> bytes:
    """Many records' spans, one after another, from columns: slice per record at 14-byte rows."""
    out = np.empty(kind.shape[0], dtype=SPAN)
    out["kind"], out["microbatch"], out["chunk"] = kind, microbatch, chunk
    out["start"], out["duration"] = start, duration
    return out.tobytes()


def pack_seq_total(seq: SeqTuple | None) -> bytes | None:
    return None if seq is None else np.array([seq], dtype=SEQ_TOTAL).tobytes()


def pack_seq_microbatches(rows: Sequence[MicrobatchSeqTuple]) -> bytes | None:
    return np.array(list(rows), dtype=SEQ_MICROBATCH).tobytes() if rows else None


def pack_span_host(start: np.ndarray, duration: np.ndarray) -> bytes:
    out = np.empty(start.shape[0], dtype=SPAN_HOST)
    out["start"], out["duration"] = start, duration
    return out.tobytes()


def unpack_spans(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=SPAN)


def unpack_seq_total(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=SEQ_TOTAL)


def unpack_seq_microbatches(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=SEQ_MICROBATCH)
