"""Join op tables of consecutive step ranges built apart into the table one build would give.

The live path builds a cold window chunk by chunk and joins the chunks' tables (`join`), keeps
each job's table between passes, extends it with the new steps' (`extend`) and drops the steps
that slid out of the window (`trim`): jobs/window_ops.py; the tables with their facts are
whatif/inputs/step_table.py's. Two fields are numbered per table: op type codes (index into `op_types`)
and host ops' seq_ids (dense, by label: the op a host gap precedes and its occurrence). Merging
maps both onto one numbering; every other field is per row already. The numbers may differ from
those of one build over the same steps, but the grouping they express is the same, and that is
all the engine reads from them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.inputs.step_table import StepTable, Tail
from smon_server.whatif.ops import OpTable

HostLabels = list[tuple[str, int]]
# A kept window's columns sit in buffers with this much room after their rows: a later pass
# writes its new steps' rows there instead of copying the whole window (~0.5 s a pass at 4,096
# ranks × 500 steps), and trimming the oldest steps only moves where the view starts (rows are
# in step order: step_table.convert). When the rows no longer fit, the column moves to a new
# buffer with as much room again.
HEADROOM = 0.25


def join_tables(parts: list[tuple[OpTable, HostLabels]]) -> tuple[OpTable, HostLabels]:
    """The parts' rows one after the other, on the first part's numbering extended by what each
    later part adds. `parts` is emptied as it is read, and each column is joined and let go of
    in turn, so a caller that keeps no other reference to the parts needs memory for the joined
    table and one column more, not twice the table (a 4,096-rank window is ~0.7 GB of columns)."""
    numbered = _renumbered(parts)
    joined: dict[str, np.ndarray] = {}
    for name, dtype in OpTable.COLUMNS.items():
        if name != "seq_sq":
            joined[name] = np.concatenate([piece.pop(name) for piece in numbered.pieces]).astype(
                dtype, copy=False
            )
    return numbered.table(joined, _join_optional(numbered.host_parts)), numbered.labels


@dataclass
class _Numbered:
    """The parts' columns on one numbering of op types and host op labels, not yet joined."""

    op_types: list[str]
    labels: HostLabels
    pieces: list[dict[str, np.ndarray]]
    ends_at_last_op: bool
    host_parts: list[np.ndarray | int]  # each part's host issue times (its length: none)
    seq_parts: list[np.ndarray | int]  # each part's Σ len² (its length: none)

    def table(self, joined: dict[str, np.ndarray], host_duration: np.ndarray) -> OpTable:
        if host_duration.shape[0] and not np.isfinite(host_duration).any():
            host_duration = np.empty(0)
        return OpTable(
            op_types=tuple(self.op_types),
            ends_at_last_op=self.ends_at_last_op,
            host_duration=host_duration,
            seq_sq=_join_optional(self.seq_parts),
            **joined,
        )


def _renumbered(parts: list[tuple[OpTable, HostLabels]]) -> _Numbered:
    """The parts' columns on the first part's numbering (its own arrays: its map is the identity)
    extended by what each later part adds; `parts` is emptied as it is read."""
    op_types: list[str] = []
    labels: HostLabels = []
    known: dict[tuple[str, int], int] = {}
    pieces: list[dict[str, np.ndarray]] = []
    ends_at_last_op = True
    host_parts: list[np.ndarray | int] = []
    seq_parts: list[np.ndarray | int] = []
    while parts:
        table, table_labels = parts.pop(0)
        type_map = np.empty(len(table.op_types), dtype=np.int32)
        for code, name in enumerate(table.op_types):
            if name not in op_types:
                op_types.append(name)
            type_map[code] = op_types.index(name)
        seq_map = np.empty(len(table_labels), dtype=np.int32)
        for local, label in enumerate(table_labels):
            if label not in known:
                known[label] = len(labels)
                labels.append(label)
            seq_map[local] = known[label]
        columns = {name: getattr(table, name) for name in OpTable.COLUMNS if name != "seq_sq"}
        # Likewise Σ len²: a part without sequence statistics adds NaN only (none: empty).
        seq_parts.append(table.seq_sq if len(table) and table.seq_sq.shape[0] == len(table) else len(table))
        # A part without host times adds NaN only: kept as its length until a part has some
        # (a 4,096-rank window's NaN column was ~0.1 GB to fill and join every pass, for nothing).
        host_parts.append(table.host_duration if table.has_host else len(table))
        if len(table) and not np.array_equal(type_map, np.arange(type_map.size)):
            columns["op_type"] = type_map[table.op_type]  # (the first part's map is the identity)
        host = table.code(O.HOST)
        if host >= 0 and seq_map.size and not np.array_equal(seq_map, np.arange(seq_map.size)):
            seq_id = table.seq_id.copy()
            is_host = table.op_type == host
            seq_id[is_host] = seq_map[table.seq_id[is_host]]
            columns["seq_id"] = seq_id
        ends_at_last_op = ends_at_last_op and table.ends_at_last_op
        pieces.append(columns)
        del table
    return _Numbered(op_types, labels, pieces, ends_at_last_op, host_parts, seq_parts)


def _append(
    old: np.ndarray, new: np.ndarray, tail: Tail | None, dtype: type[np.generic]
) -> tuple[np.ndarray, Tail]:
    """`old`'s rows then `new`'s, written after `old` in its buffer when `old` ends where the
    buffer's rows do and there is room; else both copied to a new buffer with HEADROOM."""
    n, m = old.shape[0], new.shape[0]
    if tail is not None and old.base is tail.buffer and old.strides == tail.buffer.strides:
        start = (
            old.__array_interface__["data"][0] - tail.buffer.__array_interface__["data"][0]
        ) // old.itemsize
        if start + n == tail.end and tail.end + m <= tail.buffer.shape[0]:
            tail.buffer[tail.end : tail.end + m] = new
            tail.end += m
            return tail.buffer[start : tail.end], tail
    buffer = np.empty(int((n + m) * (1 + HEADROOM)) + 1, dtype=dtype)
    buffer[:n] = old
    buffer[n : n + m] = new
    return buffer[: n + m], Tail(buffer, n + m)


def drop_unused_types(table: OpTable, keep: np.ndarray | None = None) -> OpTable:
    """The table without op types none of its rows has (they fell out of a sliding window): a
    table built over the same rows would not list them. `keep` (a mask over op_types) says which
    types to keep instead, when the table lacks rows that count (warm-up steps left out)."""
    if keep is not None:
        used = np.flatnonzero(keep)
    else:
        counts = np.bincount(table.op_type, minlength=len(table.op_types)) if len(table) else np.zeros(0)
        used = np.flatnonzero(counts[: len(table.op_types)])
    if used.size == len(table.op_types):
        return table
    renumber = np.full(len(table.op_types), -1, dtype=np.int32)
    renumber[used] = np.arange(used.size, dtype=np.int32)
    return OpTable(
        op_types=tuple(table.op_types[int(c)] for c in used),
        dp_rank=table.dp_rank,
        stage=table.stage,
        step=table.step,
        op_type=renumber[table.op_type],
        seq_id=table.seq_id,
        chunk=table.chunk,
        microbatch=table.microbatch,
        start=table.start,
        duration=table.duration,
        rank=table.rank,
        seq_sq=table.seq_sq,
        host_duration=table.host_duration,
        ends_at_last_op=table.ends_at_last_op,
    )


def _join_optional(parts: list[np.ndarray | int]) -> np.ndarray:
    """An optional float column joined: NaN for the parts without it, empty when none has it."""
    if all(isinstance(part, int) for part in parts):
        return np.empty(0)
    return np.concatenate([np.full(part, np.nan) if isinstance(part, int) else part for part in parts])


def join(tables: list[StepTable]) -> StepTable:
    """The tables of consecutive step ranges (each from the step after the one before's
    `through`) as one. `tables` is emptied: the joined columns are the only copy left."""
    times = np.concatenate([t.times for t in tables])
    row_steps = np.concatenate([t.row_steps for t in tables])
    newest = [(t.ops.op_types, t.type_newest) for t in tables]
    parts = [(t.ops, t.labels) for t in tables]
    through = tables[-1].through
    tables.clear()  # the parts list is the only reference left: join_tables lets go as it joins
    ops, labels = join_tables(parts)
    return StepTable(
        ops=ops,
        labels=labels,
        through=through,
        times=times,
        row_steps=row_steps,
        type_newest=_newest_by_type(ops, newest),
    )


def extend(old: StepTable, new: StepTable) -> StepTable:
    """`old` with the steps of `new` (which follow it) after its own: the rows of `new` are written
    after `old`'s in their buffers where there is room (HEADROOM), else both are copied once."""
    numbered = _renumbered([(old.ops, old.labels), (new.ops, new.labels)])
    kept, added = numbered.pieces
    room = dict(old.room)
    joined: dict[str, np.ndarray] = {}
    for name, dtype in OpTable.COLUMNS.items():
        if name != "seq_sq":
            joined[name], room[name] = _append(kept.pop(name), added.pop(name), room.get(name), dtype)
    kept_host, added_host = numbered.host_parts
    if isinstance(kept_host, int) or isinstance(added_host, int):
        host_duration = _join_optional(numbered.host_parts)
    else:
        host_duration, room["host_duration"] = _append(
            kept_host, added_host, room.get("host_duration"), np.float64
        )
    newest = [(old.ops.op_types, old.type_newest), (new.ops.op_types, new.type_newest)]
    ops = numbered.table(joined, host_duration)
    return StepTable(
        ops=ops,
        labels=numbered.labels,
        through=new.through,
        times=np.concatenate([old.times, new.times]),
        row_steps=np.concatenate([old.row_steps, new.row_steps]),
        type_newest=_newest_by_type(ops, newest),
        room=room,
    )


def trim(table: StepTable, lo: int) -> StepTable:
    """The table without the steps before `lo`; op types left without ops are dropped, as a
    table built over the remaining steps (skipped ones included) would not have them."""
    if not table.row_steps.size or int(table.row_steps[0]) >= lo:
        return table
    keep = table.type_newest >= lo
    ops = table.ops.since(lo)
    if ops.seq_sq.shape[0] and len(ops) and not np.isfinite(ops.seq_sq).any():
        ops = replace(ops, seq_sq=np.empty(0))  # the steps with sequence statistics slid out
    return replace(
        table,
        ops=drop_unused_types(ops, keep),
        times=table.times[table.times[:, 0] >= lo],
        row_steps=table.row_steps[table.row_steps >= lo],
        type_newest=table.type_newest[keep],
    )


def _newest_by_type(ops: OpTable, parts: list[tuple[tuple[str, ...], np.ndarray]]) -> np.ndarray:
    """`type_newest` of a table joined from parts, from the parts' own."""
    out = np.full(len(ops.op_types), np.iinfo(np.int64).min)
    for op_types, newest in parts:
        at = np.array([ops.op_types.index(name) for name in op_types], dtype=np.int64)
        if at.size:
            out[at] = np.maximum(out[at], newest)
    return out
