"""Turn stored agent step records (as columns) into the engine's operation table.

Each span an agent timed becomes one operation of the matching op type (DESIGN §5). On the way:
- A span nested in another (a GC pause inside forward, a custom phase inside a step phase) is
  carved out of the enclosing op, which keeps only its exclusive time: no double counting.
- Every stretch of the step no span covers becomes a `host` op (untimed host work: logging,
  evaluation loops, clipping, sleeps), so the replayed step is the real one and work outside the
  timed phases can be blamed like any other.
- Steps are re-cut at the step's last collective (the DDP gradient all-reduce): what a rank does
  after it (optimizer, a GC pause, rank 0's evaluation) delays the *next* step's collective on
  every other rank, so it is replayed as the start of that next step. The collective ends at the
  same instant on every rank, so every rank's replayed step then starts together, as the replay
  assumes. The first step of each run of consecutive steps (numbered one apart, or further apart
  but back to back in time: a script numbering steps by samples) only lends its tail to the next
  one (its own start is not in the window), so callers pass one step before the window they want.
  A job without collectives keeps the agent's boundaries (the optimizer step).
- TP peers of one worker run in lockstep: only the lowest tp_rank of each (dp_rank, stage) worker
  is kept for the simulation (the per-rank heatmap still reads every rank's records).

Everything is array arithmetic over all records and spans at once (a 4,096-rank window holds tens
of millions of spans); Python loops run over op types and span positions only.
"""

from __future__ import annotations

import numpy as np

from smon_server.columns import StepColumns, segment_starts, segmented_running_max
from smon_server.whatif import ops as O
from smon_server.whatif.inputs.host_line import replay_line
from smon_server.whatif.ops import OpTable

# Agent span kind -> engine op type. Kinds not listed keep their own name (custom phases).
SPAN_OP_TYPES: dict[str, str] = {
    "data_wait": O.DATA_WAIT,
    "forward": O.FORWARD_COMPUTE,
    "backward": O.BACKWARD_COMPUTE,
    "grad_sync": O.GRADS_ALL_REDUCE,
    "optimizer": O.OPTIMIZER,
    "gc": O.GC,
    "checkpoint": O.CHECKPOINT,
    "forward_send": O.FORWARD_SEND,
    "forward_recv": O.FORWARD_RECV,
    "backward_send": O.BACKWARD_SEND,
    "backward_recv": O.BACKWARD_RECV,
}

# Gaps shorter than this between timed phases are timer noise, not host work.
MIN_HOST_GAP = 2e-6
# A span that ends this little past its enclosing span still counts as nested in it.
NEST_SLACK = 1e-9
# The store keeps span offsets and durations as float32 (relative error 6e-8): comparisons of
# times within a step allow a few units of that on top of the absolute slacks.
F32_SLACK = 2.5e-7
_TAIL = "<end>"  # a host op at the end of a step is named by this instead of an op it precedes


def complete_steps(cols: StepColumns, workers: int | None = None) -> StepColumns:
    """Keep the steps every reporting worker has finished (the newest step is often partial);
    `workers` is how many there are, when `cols` is only part of the job's records."""
    if not len(cols):
        return cols
    worker = _worker_ids(cols)
    workers = workers or int(worker.max()) + 1
    first, last = int(cols.step.min()), int(cols.step.max())
    if (last - first + 1) * workers <= 4 * len(cols) + 4096:
        # A window's steps are (nearly) contiguous: mark (step, worker) seen in a dense grid
        # rather than sorting the pairs.
        step_index = cols.step - first
        seen = np.zeros((last - first + 1, max(workers, int(worker.max()) + 1)), dtype=bool)
        seen[step_index, worker] = True
        per_step = np.count_nonzero(seen, axis=1)
    else:
        steps, step_index = np.unique(cols.step, return_inverse=True)
        pairs = np.unique(step_index.astype(np.int64) * workers + worker)  # (step, worker) seen
        per_step = np.bincount(pairs // workers, minlength=steps.size)
    keep = per_step[step_index] == workers
    return cols if keep.all() else cols.take(keep)


def build_op_table(cols: StepColumns) -> OpTable:
    """The op table alone, for a build that is never merged (offline.analyze_profile)."""
    return build_labelled_op_table(cols)[0]


def build_labelled_op_table(cols: StepColumns) -> tuple[OpTable, list[tuple[str, int]]]:
    """The op table, and for each host op seq_id its label (the op type it precedes, or
    `<end>`, and that op's occurrence): what lets tables of consecutive steps built apart be
    merged into one (whatif/inputs/merge.py)."""
    cols = _lead_tp(cols)
    cols, _ = replay_line(cols, SPAN_OP_TYPES)  # device time hidden behind the host (host_line.py)
    order = np.lexsort((cols.step, cols.rank))
    if not np.array_equal(order, np.arange(order.size)):
        cols = cols.take(order)
    spans = _Spans.sorted_from(cols)
    excl = _exclusive_durations(spans)

    # Op types: one name per span kind.
    kind_op = [SPAN_OP_TYPES.get(kind, kind) for kind in cols.kinds]
    names = sorted({*kind_op, O.HOST})
    name_code = {name: i for i, name in enumerate(names)}
    kind_code = np.array([name_code[n] for n in kind_op], dtype=np.int64).reshape(-1)
    collective_kind = np.array([n in O.COLLECTIVE_OP_TYPES for n in kind_op], dtype=bool).reshape(-1)
    op = kind_code[spans.kind] if spans.kind.size else np.zeros(0, dtype=np.int64)
    collective = collective_kind[spans.kind] if spans.kind.size else np.zeros(0, dtype=bool)

    # Step windows: record r's replayed step runs from the previous step's cut (its last
    # collective's end) when it continues a run, else from its own start, to its own cut (or end).
    n = len(cols)
    abs_start = cols.start_time[spans.record] + spans.start
    abs_end = abs_start + spans.duration
    cut = _max_per_segment(abs_end[collective], spans.record[collective], n, -np.inf)
    has_cut = np.isfinite(cut)
    continues = np.zeros(n, dtype=bool)
    if n > 1:
        # The next step, or (numbered further on: steps counted in samples) one that began as
        # its rank's previous record ended. A gap in numbers with time in between is steps that
        # were not recorded (dropped, or not sampled by the agent): their tail is gone.
        gap = cols.step[1:] - cols.step[:-1]
        idle = cols.start_time[1:] - (cols.start_time[:-1] + cols.duration[:-1])
        adjacent = (gap == 1) | ((gap > 1) & (idle <= 0.5 * cols.duration[1:]))
        continues[1:] = (cols.rank[1:] == cols.rank[:-1]) & adjacent & has_cut[:-1]
    window_start = np.where(continues, np.r_[0.0, cut[:-1]] if n else cut, cols.start_time)
    window_end = np.where(has_cut, cut, cols.start_time + cols.duration)
    emitted = continues | ~has_cut

    # Each span goes to its record's window, or (at or after the cut) to the next record's.
    cut_slack = F32_SLACK * np.abs(cut - cols.start_time)
    after_cut = has_cut[spans.record] & (abs_start >= (cut - cut_slack)[spans.record])
    window = spans.record + after_cut
    next_continues = np.r_[continues[1:], False] if n else continues
    keep = np.where(after_cut, next_continues[spans.record], emitted[spans.record])
    window, op, excl = window[keep], op[keep], excl[keep]
    rel_start = abs_start[keep] - window_start[window]
    rel_end = abs_end[keep] - window_start[window]
    microbatch, chunk = spans.microbatch[keep], spans.chunk[keep]
    host_view = spans.host_duration[keep] if spans.host_duration is not None else None

    occurrence = _occurrences(op, window, len(names))
    # Untimed host work: the gap before each op (from the furthest end reached so far in its
    # window) and after the window's last op.
    first = segment_starts(window)
    reach = segmented_running_max(rel_end, window)
    cursor = np.maximum(np.r_[0.0, reach[:-1]] if reach.size else reach, 0.0)
    cursor[first] = 0.0
    host_before = rel_start - cursor > MIN_HOST_GAP + F32_SLACK * np.abs(rel_start)
    final = np.maximum(_max_per_segment(rel_end, window, n, 0.0), 0.0)
    length = window_end - window_start
    tail = emitted & (length - final > MIN_HOST_GAP + F32_SLACK * np.abs(length))

    # Rows in replay order: per window, each op preceded by its host gap, then the tail.
    per_op = 1 + host_before.astype(np.int64)
    window_rows = np.bincount(window, weights=per_op, minlength=n).astype(np.int64) + tail
    window_offset = np.cumsum(window_rows) - window_rows
    rows_before = np.cumsum(per_op) - per_op
    before_in_window = rows_before - rows_before[first][np.cumsum(first) - 1] if window.size else rows_before
    op_row = window_offset[window] + before_in_window + host_before
    host_row = op_row[host_before] - 1
    tail_windows = np.flatnonzero(tail)
    tail_row = window_offset[tail_windows] + window_rows[tail_windows] - 1
    total = int(window_rows.sum())

    record = np.empty(total, dtype=np.int64)
    # In the table's own dtypes: no second pass to convert them (a chunk of 4,096 ranks is ~2 M rows).
    out_op = np.empty(total, dtype=np.int32)
    out_seq = np.empty(total, dtype=np.int32)
    out_start = np.empty(total)
    out_duration = np.empty(total)
    out_mb = np.full(total, -1, dtype=np.int16)
    out_chunk = np.zeros(total, dtype=np.int16)
    record[op_row], record[host_row], record[tail_row] = window, window[host_before], tail_windows
    host_code = name_code[O.HOST]
    out_op[op_row], out_op[host_row], out_op[tail_row] = op, host_code, host_code
    out_start[op_row] = rel_start
    out_start[host_row] = cursor[host_before]
    out_start[tail_row] = final[tail_windows]
    out_duration[op_row] = excl
    out_duration[host_row] = (rel_start - cursor)[host_before]
    out_duration[tail_row] = (length - final)[tail_windows]
    out_mb[op_row], out_chunk[op_row] = microbatch, chunk
    out_host = np.empty(0)
    if host_view is not None and np.isfinite(host_view).any():
        out_host = np.full(total, np.nan)
        out_host[op_row] = host_view
    out_seq[op_row] = occurrence
    # A host op is named by the op it precedes and that op's occurrence, so rank 0's occasional
    # evaluation or a sleep before each micro-step's forward line up across steps and workers;
    # the pairs are numbered densely in order of first appearance.
    host_key = np.full(total, -1, dtype=np.int64)
    stride = int(occurrence.max()) + 2 if occurrence.size else 2
    host_key[host_row] = op[host_before] * stride + occurrence[host_before]
    host_key[tail_row] = len(names) * stride
    is_host = out_op == host_code
    out_seq[is_host], host_keys = _first_appearance_rank(host_key[is_host])
    labels = [
        (names[int(k) // stride] if int(k) // stride < len(names) else _TAIL, int(k) % stride)
        for k in host_keys
    ]
    op_types, renumber = _renumber_by_first_appearance(out_op, names)

    table = OpTable(
        op_types=op_types,
        dp_rank=cols.dp_rank[record].astype(np.int32, copy=False),
        stage=cols.pp_rank[record].astype(np.int32, copy=False),
        step=cols.step[record].astype(np.int64, copy=False),
        op_type=renumber.astype(np.int32)[out_op],
        seq_id=out_seq,
        chunk=out_chunk,
        microbatch=out_mb,
        start=window_start[record] + out_start,
        duration=out_duration,
        rank=cols.rank.astype(np.int32)[record],
        seq_sq=_seq_sq(cols, record, out_op, out_mb, name_code),
        host_duration=out_host,
        ends_at_last_op=True,
    )
    return table, labels


def _max_per_segment(values: np.ndarray, segment: np.ndarray, n: int, empty: float) -> np.ndarray:
    """Per segment id in [0, n), the maximum of its `values` (contiguous, sorted ids), else `empty`."""
    out = np.full(n, empty)
    if values.size:
        first = np.flatnonzero(segment_starts(segment))
        out[segment[first]] = np.maximum.reduceat(values, first)
    return out


def _worker_ids(cols: StepColumns) -> np.ndarray:
    """A dense id per (dp_rank, stage) worker."""
    key = cols.dp_rank.astype(np.int64) * (1 << 32) + cols.pp_rank.astype(np.int64)
    return np.unique(key, return_inverse=True)[1].ravel()


def _lead_tp(cols: StepColumns) -> StepColumns:
    """Only the lowest tp_rank of each (dp_rank, stage) worker: TP peers run in lockstep."""
    if not len(cols) or not cols.tp_rank.any():
        return cols
    worker = _worker_ids(cols)
    lead = np.full(int(worker.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(lead, worker, cols.tp_rank.astype(np.int64))
    keep = cols.tp_rank == lead[worker]
    return cols if keep.all() else cols.take(keep)


class _Spans:
    """The spans of sorted records, each record's in start order (an enclosing span before the
    ones it contains: longer first on equal starts)."""

    def __init__(self, cols: StepColumns, order: np.ndarray | None) -> None:
        pick = (lambda a: a) if order is None else (lambda a: a[order])
        self.record = pick(cols.span_record)
        self.kind = pick(cols.span_kind)
        self.start = pick(cols.span_start)
        self.duration = pick(cols.span_duration)
        self.microbatch = pick(cols.span_microbatch)
        self.chunk = pick(cols.span_chunk)
        self.host_duration = pick(cols.span_host_duration) if cols.has_host else None

    @classmethod
    def sorted_from(cls, cols: StepColumns) -> _Spans:
        record, start, duration = cols.span_record, cols.span_start, cols.span_duration
        same = record[1:] == record[:-1]
        in_order = (start[1:] > start[:-1]) | ((start[1:] == start[:-1]) & (duration[1:] <= duration[:-1]))
        if bool(np.all(in_order | ~same)):  # the store keeps them sorted: usually nothing to do
            return cls(cols, None)
        return cls(cols, np.lexsort((-duration, start, record)))


def _exclusive_durations(spans: _Spans) -> np.ndarray:
    """Each span's duration minus the union of the later spans of its record contained in it (a GC
    pause inside forward, a custom phase inside backward), so no second is replayed twice.

    Spans are in start order, so the spans contained in span i follow it directly and the first
    span starting at or after its end closes the search. All spans advance together, one offset
    k at a time, sweeping the union of their contained spans; a span leaves the sweep at its
    first span past its end, so the passes do work in proportion to the nesting, not k × spans."""
    record, start = spans.record, spans.start
    size = record.size
    end = start + spans.duration
    covered = np.zeros(size)
    reach = np.full(size, -np.inf)
    # The first offset on whole columns (slices, no gathers): most spans contain none, and only
    # those whose next span starts inside them go on.
    active = np.flatnonzero((record[1:] == record[:-1]) & (start[1:] < end[:-1]))
    k = 1
    while active.size:
        j = active + k
        open_ = j < size
        active, j = active[open_], j[open_]
        open_ = (record[j] == record[active]) & (start[j] < end[active])
        active, j = active[open_], j[open_]
        inside = end[j] <= end[active] + NEST_SLACK + F32_SLACK * np.abs(end[active])
        i, j = active[inside], j[inside]
        covered[i] += np.maximum(0.0, end[j] - np.maximum(start[j], reach[i]))
        reach[i] = np.maximum(reach[i], end[j])
        k += 1
    return np.maximum(0.0, spans.duration - covered)


def _occurrences(op: np.ndarray, window: np.ndarray, n_codes: int) -> np.ndarray:
    """How many ops of the same type came before each op in its window."""
    out = np.zeros(op.size, dtype=np.int64)
    for code in range(n_codes):
        idx = np.flatnonzero(op == code)
        if not idx.size:
            continue
        rank = np.arange(idx.size)
        first = np.maximum.accumulate(np.where(segment_starts(window[idx]), rank, 0))
        out[idx] = rank - first
    return out


def _first_appearance_rank(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense numbers for `keys`, in the order each key first appears, and the key of each number."""
    if not keys.size:
        return keys.astype(np.int64), keys.astype(np.int64)
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    appearance = np.argsort(first, kind="stable")
    rank = np.empty(first.size, dtype=np.int64)
    rank[appearance] = np.arange(first.size)
    return rank[inverse.ravel()], unique[appearance]


def _renumber_by_first_appearance(codes: np.ndarray, names: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """Op type names in the order they first appear in the table, and old code -> new code."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(names)))
    first = np.array([int(np.argmax(codes == c)) for c in used], dtype=np.int64)
    ordered = used[np.argsort(first)]
    renumber = np.full(len(names), -1, dtype=np.int64)
    renumber[ordered] = np.arange(ordered.size)
    return tuple(names[c] for c in ordered), renumber


def _seq_sq(
    cols: StepColumns, record: np.ndarray, op: np.ndarray, microbatch: np.ndarray, name_code: dict[str, int]
) -> np.ndarray:
    """Σ len² of each compute op's micro-batch (or of the whole step when not per micro-batch);
    empty when no record has sequence statistics (the usual case: a column of NaN would be
    8 bytes an op in every kept window for nothing, OpTable.seq_sq)."""
    if not cols.mb_index.size and not bool((cols.seq_sum_sq > 0).any()):
        return np.empty(0)  # no sequence statistics at all: the usual case, and a pass over every op
    out = np.full(record.size, np.nan)
    compute = np.isin(op, [name_code.get(O.FORWARD_COMPUTE, -1), name_code.get(O.BACKWARD_COMPUTE, -1)])
    whole = compute & (microbatch < 0)
    step_sq = cols.seq_sum_sq[record]
    out[whole & (step_sq > 0)] = step_sq[whole & (step_sq > 0)]
    per_mb = np.flatnonzero(compute & (microbatch >= 0))
    if per_mb.size and cols.mb_index.size:
        table = cols.mb_record * 65536 + (cols.mb_index.astype(np.int64) + 32768)
        order = np.argsort(table, kind="stable")
        # The last row of a repeated (record, micro-batch) wins, as a dict built from them would.
        table, values = table[order], cols.mb_sum_sq[order]
        wanted = record[per_mb] * 65536 + (microbatch[per_mb].astype(np.int64) + 32768)
        at = np.searchsorted(table, wanted, side="right") - 1
        found = (at >= 0) & (table[np.maximum(at, 0)] == wanted)
        out[per_mb[found]] = values[at[found]]
    return out if np.isfinite(out).any() else np.empty(0)  # empty exactly when none is known
