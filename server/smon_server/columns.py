"""Step records as columns: the one shape the store reads a window into and the engine builds its
operation table from (whatif/inputs/from_steps.py).

A window of a 4,096-rank job holds millions of records and tens of millions of spans; as Python
objects they cost more than the whole analysis. Here every field is a numpy array: one row per
record, and the records' spans (and per-micro-batch sequence statistics) flattened into arrays
of their own, in record order, with a count per record. Nothing here depends on the database or
on the engine, so both can use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np


class StepLike(Protocol):
    """One step record as rows (tests, small tools): what `StepColumns.from_rows` reads."""

    @property
    def rank(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def dp_rank(self) -> int: ...
    @property
    def pp_rank(self) -> int: ...
    @property
    def tp_rank(self) -> int: ...
    @property
    def start_time(self) -> float: ...
    @property
    def duration(self) -> float: ...
    @property
    def phases(self) -> Mapping[str, float]: ...
    @property
    def spans(self) -> Sequence[Sequence[Any]]: ...
    @property
    def seq_sum_sq(self) -> float: ...
    @property
    def microbatch_seq(self) -> Sequence[Sequence[Any]]: ...


@dataclass(frozen=True)
class StepColumns:
    """Records (one row each) and their spans / micro-batch rows, flattened in record order.

    `span_kind` indexes `kinds`. Span starts are relative to their record's `start_time`.
    `gc_seconds` is every GC pause of the step, however short (short ones are not spans)."""

    kinds: tuple[str, ...]
    rank: np.ndarray  # int64
    step: np.ndarray  # int64
    dp_rank: np.ndarray  # int32
    pp_rank: np.ndarray  # int32
    tp_rank: np.ndarray  # int32
    start_time: np.ndarray  # float64, server clock
    duration: np.ndarray  # float64
    gc_count: np.ndarray  # int32
    gc_seconds: np.ndarray  # float64
    seq_sum_sq: np.ndarray  # float64
    span_count: np.ndarray  # int64, spans per record
    span_kind: np.ndarray  # int32
    span_start: np.ndarray  # float64
    span_duration: np.ndarray  # float64
    span_microbatch: np.ndarray  # int32, -1 when not per micro-batch
    span_chunk: np.ndarray  # int32
    mb_count: np.ndarray  # int64, micro-batch rows per record
    mb_index: np.ndarray  # int32, the micro-batch
    mb_sum_sq: np.ndarray  # float64
    # A device-timed span's host view (docs/analysis.md "Device time behind the host"): when the
    # host issued it, relative to the record's start, and for how long; NaN where the agent timed
    # the span on the host only. Empty arrays when no span of these records has one.
    span_host_start: np.ndarray = field(default_factory=lambda: np.zeros(0))
    span_host_duration: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __len__(self) -> int:
        return int(self.rank.shape[0])

    @property
    def has_host(self) -> bool:
        """Whether the spans carry host views (else the host arrays are empty)."""
        return bool(self.span_host_start.size) and self.span_host_start.size == self.span_kind.size

    @property
    def span_record(self) -> np.ndarray:
        """Index of the record each span belongs to."""
        return np.repeat(np.arange(len(self)), self.span_count)

    @property
    def mb_record(self) -> np.ndarray:
        return np.repeat(np.arange(len(self)), self.mb_count)

    def take(self, records: np.ndarray) -> StepColumns:
        """The records at `records` (a boolean mask or an index array, any order), spans with them."""
        index = np.flatnonzero(records) if records.dtype == bool else np.asarray(records, dtype=np.int64)
        spans = _segments(self.span_count, index)
        mbs = _segments(self.mb_count, index)
        return StepColumns(
            kinds=self.kinds,
            rank=self.rank[index],
            step=self.step[index],
            dp_rank=self.dp_rank[index],
            pp_rank=self.pp_rank[index],
            tp_rank=self.tp_rank[index],
            start_time=self.start_time[index],
            duration=self.duration[index],
            gc_count=self.gc_count[index],
            gc_seconds=self.gc_seconds[index],
            seq_sum_sq=self.seq_sum_sq[index],
            span_count=self.span_count[index],
            span_kind=self.span_kind[spans],
            span_start=self.span_start[spans],
            span_duration=self.span_duration[spans],
            span_microbatch=self.span_microbatch[spans],
            span_chunk=self.span_chunk[spans],
            mb_count=self.mb_count[index],
            mb_index=self.mb_index[mbs],
            mb_sum_sq=self.mb_sum_sq[mbs],
            **(
                {
                    "span_host_start": self.span_host_start[spans],
                    "span_host_duration": self.span_host_duration[spans],
                }
                if self.has_host
                else {}
            ),
        )

    @classmethod
    def concat(cls, parts: Sequence[StepColumns]) -> StepColumns:
        """The records of `parts` one after the other. Their kinds must agree: span kind codes
        only ever grow, so one part's kinds may extend another's."""
        kinds = max((p.kinds for p in parts), key=len)
        if any(p.kinds != kinds[: len(p.kinds)] for p in parts):
            raise ValueError("columns with different span kind codes")
        host = ("span_host_start", "span_host_duration")
        names = [f.name for f in fields(cls) if f.name != "kinds" and f.name not in host]
        out = {n: np.concatenate([getattr(p, n) for p in parts]) for n in names}
        if any(p.has_host for p in parts):
            for n in host:
                out[n] = np.concatenate(
                    [getattr(p, n) if p.has_host else np.full(p.span_kind.size, np.nan) for p in parts]
                )
        return cls(kinds=kinds, **out)

    def phase_seconds(self, name: str) -> np.ndarray:
        """Seconds per record in phase `name` (NaN where the record has none), as the agent reports
        them: spans of that kind summed; `gc` every pause; `other` the step no span covers."""
        if name == "gc":
            return np.where(self.gc_count > 0, self.gc_seconds, np.nan)
        if name == "other":
            # Spans of kind `other` (phase names a job sent past its limit, store/kinds.py) are
            # counted here too: they cover no named phase.
            return np.maximum(0.0, self.duration - self.covered_seconds(excluding="other"))
        code = self.kinds.index(name) if name in self.kinds else -1
        mine = self.span_kind == code
        total = np.bincount(self.span_record[mine], weights=self.span_duration[mine], minlength=len(self))
        seen = np.bincount(self.span_record[mine], minlength=len(self)) > 0
        return np.where(seen, total, np.nan)

    def phase_table(self) -> dict[str, np.ndarray]:
        """Seconds per record of every phase any record has (NaN where a record has none),
        `gc` and `other` included: the agent's `phases` map, rebuilt from the spans."""
        present = np.unique(self.span_kind)
        names = [self.kinds[int(code)] for code in present]
        out = {name: self.phase_seconds(name) for name in names}
        out["gc"] = self.phase_seconds("gc")
        out["other"] = self.phase_seconds("other")
        return out

    def covered_seconds(self, excluding: str | None = None) -> np.ndarray:
        """Per record, the length of the union of its spans (but those of kind `excluding`)
        clipped to [0, duration]."""
        record, start, duration = self.span_record, self.span_start, self.span_duration
        if excluding in self.kinds:
            keep = self.span_kind != self.kinds.index(excluding)
            if not keep.all():
                record, start, duration = record[keep], start[keep], duration[keep]
        lo = np.clip(start, 0.0, self.duration[record])
        hi = np.clip(start + duration, 0.0, self.duration[record])
        # Stored spans are in start order within their record (the agent times them in order):
        # then the sort would be the identity, and it is most of this function's time.
        if not _sorted_within(lo, record):
            order = np.lexsort((lo, record))
            record, lo, hi = record[order], lo[order], hi[order]
        # The furthest end reached by earlier spans of the same record: a span adds only what
        # lies beyond it.
        reach = segmented_running_max(hi, record)
        before = np.r_[-np.inf, reach[:-1]] if reach.size else reach
        before[segment_starts(record)] = -np.inf
        added = np.clip(hi - np.maximum(lo, before), 0.0, None)
        return np.bincount(record, weights=added, minlength=len(self))

    @classmethod
    def from_rows(cls, rows: Iterable[StepLike]) -> StepColumns:
        """Columns of row records. A record with phases but no spans gets its phases laid end to
        end from the step's start, in the order a training step runs them (`spans_from_phases`)."""
        rows = list(rows)
        kinds: dict[str, int] = {}
        span_rows: list[tuple[int, float, float, int, int]] = []
        host_rows: list[tuple[float, float]] = []
        span_count, mb_count = [], []
        mb_rows: list[tuple[int, float]] = []
        for r in rows:
            spans: list[Sequence[Any]] = list(r.spans) or list(spans_from_phases(r.phases))
            span_count.append(len(spans))
            for s in spans:
                code = kinds.setdefault(str(s[0]), len(kinds))
                span_rows.append((code, float(s[1]), float(s[2]), int(s[3]), int(s[4])))
                # (kind, start, duration, micro-batch, chunk[, host start, host duration])
                host_rows.append((float(s[5]), float(s[6])) if len(s) >= 7 else (np.nan, np.nan))
            mb_count.append(len(r.microbatch_seq))
            mb_rows.extend((int(m[0]), float(m[3])) for m in r.microbatch_seq)
        spans_arr = np.array(span_rows, dtype=np.float64).reshape(-1, 5)
        host_arr = np.array(host_rows, dtype=np.float64).reshape(-1, 2)
        host = (
            {}
            if np.isnan(host_arr).all()
            else {"span_host_start": host_arr[:, 0], "span_host_duration": host_arr[:, 1]}
        )
        mb_arr = np.array(mb_rows, dtype=np.float64).reshape(-1, 2)
        phases = [r.phases for r in rows]
        return cls(
            kinds=tuple(kinds),
            rank=np.array([r.rank for r in rows], dtype=np.int64),
            step=np.array([r.step for r in rows], dtype=np.int64),
            dp_rank=np.array([r.dp_rank for r in rows], dtype=np.int32),
            pp_rank=np.array([r.pp_rank for r in rows], dtype=np.int32),
            tp_rank=np.array([r.tp_rank for r in rows], dtype=np.int32),
            start_time=np.array([r.start_time for r in rows], dtype=np.float64),
            duration=np.array([r.duration for r in rows], dtype=np.float64),
            gc_count=np.array([1 if p.get("gc") else 0 for p in phases], dtype=np.int32),
            gc_seconds=np.array([float(p.get("gc", 0.0)) for p in phases], dtype=np.float64),
            seq_sum_sq=np.array([r.seq_sum_sq for r in rows], dtype=np.float64),
            span_count=np.array(span_count, dtype=np.int64),
            span_kind=spans_arr[:, 0].astype(np.int32),
            span_start=spans_arr[:, 1],
            span_duration=spans_arr[:, 2],
            span_microbatch=spans_arr[:, 3].astype(np.int32),
            span_chunk=spans_arr[:, 4].astype(np.int32),
            mb_count=np.array(mb_count, dtype=np.int64),
            mb_index=mb_arr[:, 0].astype(np.int32),
            mb_sum_sq=mb_arr[:, 1],
            **host,
        )


def worker_ids(dp_rank: np.ndarray, pp_rank: np.ndarray) -> np.ndarray:
    """One int64 per (dp_rank, stage) worker: how the store's aggregates and the window's op
    tables name the workers whose reports make a step complete."""
    return np.asarray(dp_rank).astype(np.int64) << 32 | np.asarray(pp_rank).astype(np.int64)


def reporting_workers(records: StepColumns) -> tuple[np.ndarray, np.ndarray]:
    """The sorted worker ids in `records`, and the newest step each reported."""
    ids = worker_ids(records.dp_rank, records.pp_rank)
    workers, index = np.unique(ids, return_inverse=True)
    last_seen = np.full(workers.size, np.iinfo(np.int64).min)
    np.maximum.at(last_seen, index.ravel(), records.step)
    return workers, last_seen


# Phase-only records: the order a training step runs its phases in.
PHASE_ORDER = ("data_wait", "h2d", "forward", "backward", "grad_sync", "optimizer", "checkpoint")


def spans_from_phases(phases: Mapping[str, float]) -> list[tuple[str, float, float, int, int]]:
    """Spans for a record that reports phase totals only (a client without span timing): the
    phases end to end from the step's start, canonical ones first, then the rest by name. `gc`
    and `other` are not phases of their own (GC sits inside others; `other` is the rest)."""
    ordered = [p for p in PHASE_ORDER if p in phases]
    ordered += sorted(p for p in phases if p not in PHASE_ORDER and p not in ("gc", "other"))
    out, offset = [], 0.0
    for phase in ordered:
        duration = float(phases[phase])
        out.append((phase, offset, duration, -1, 0))
        offset += duration
    return out


def dense_codes(values: np.ndarray, size: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, each value's index among them) of small non-negative integers (kind
    codes), by a bincount: no sort of every element, as np.unique would do."""
    if not values.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    present = np.bincount(values, minlength=size) > 0
    return np.flatnonzero(present), (np.cumsum(present) - 1)[values]


def dense_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, ascending; each value's index among them) of any integers (step
    numbers, ranks): a bincount over their span where it is within a few times their count (no
    sort), else a sort. Memory follows how many values there are, never how large they are."""
    if not values.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo + 1 > 4 * values.size + (1 << 16):
        numbers, index = np.unique(values, return_inverse=True)
        return numbers.astype(np.int64), index.ravel().astype(np.int64)
    present = np.bincount(values - lo, minlength=hi - lo + 1) > 0
    return (np.flatnonzero(present) + lo).astype(np.int64), (np.cumsum(present) - 1)[values - lo]


def segmented_running_max(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Running maximum of `values` that restarts where `segment` changes (segments contiguous).

    One pass per position within a segment, each over the segments at least that long: segments
    here are a step's spans (a handful to a few hundred), so this is a few dozen array operations,
    exact, with no sort."""
    out = np.array(values, dtype=np.float64, copy=True)
    if out.size == 0:
        return out
    first = np.flatnonzero(segment_starts(segment))
    lengths = np.diff(np.r_[first, out.size])
    longest_first = first[np.argsort(-lengths, kind="stable")]
    at_least = np.sort(lengths)[::-1]  # at_least[i]: length of the i-th longest segment
    for k in range(1, int(at_least[0])):
        count = int(np.searchsorted(-at_least, -k, side="left"))  # segments longer than k
        idx = longest_first[:count] + k
        out[idx] = np.maximum(out[idx], out[idx - 1])
    return out


def _sorted_within(values: np.ndarray, segment: np.ndarray) -> bool:
    """Whether `values` never decrease within a run of equal, ascending `segment` values: a
    stable sort by (segment, value) would leave them where they are."""
    if values.size < 2:
        return True
    return bool(np.all((values[1:] >= values[:-1]) | (segment[1:] > segment[:-1])))


def segment_starts(segment: np.ndarray) -> np.ndarray:
    """True where a contiguous run of equal `segment` values begins."""
    return np.r_[True, segment[1:] != segment[:-1]] if segment.size else np.zeros(0, dtype=bool)


def _segments(counts: np.ndarray, records: np.ndarray) -> np.ndarray:
    """Indices into a flattened per-record array of the items of `records`, in that order."""
    offsets = np.concatenate(([0], np.cumsum(counts)))
    lengths = counts[records]
    starts = np.repeat(offsets[records], lengths)
    within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return starts + within
