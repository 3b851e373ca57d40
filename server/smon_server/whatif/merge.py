"""Join op tables of consecutive step ranges built apart into the table one build would give.

The live path keeps each job's op table between passes and builds only the new steps' ops
(jobs/window_ops.py). Two fields are numbered per table: op type codes (index into `op_types`)
and host ops' seq_ids (dense, by label: the op a host gap precedes and its occurrence). Merging
maps both onto one numbering; every other field is per row already. The numbers may differ from
those of one build over the same steps, but the grouping they express is the same, and that is
all the engine reads from them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smon_server.whatif import ops as O
from smon_server.whatif.ops import OpTable

HostLabels = list[tuple[str, int]]


def merge_tables(
    old: OpTable, old_labels: HostLabels, new: OpTable, new_labels: HostLabels
) -> tuple[OpTable, HostLabels]:
    """`old`'s rows then `new`'s, on `old`'s numbering extended by what `new` adds."""
    return join_tables([(old, old_labels), (new, new_labels)])


def join_tables(parts: Sequence[tuple[OpTable, HostLabels]]) -> tuple[OpTable, HostLabels]:
    """The parts' rows one after the other, on the first part's numbering extended by what each
    later part adds; every column is copied once, whatever the number of parts."""
    op_types: list[str] = []
    labels: HostLabels = []
    known: dict[tuple[str, int], int] = {}
    op_type_parts, seq_id_parts = [], []
    for table, table_labels in parts:
        type_map = np.empty(len(table.op_types), dtype=np.int16)
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
        op_type_parts.append(type_map[table.op_type] if len(table) else table.op_type)
        seq_id = table.seq_id
        host = table.code(O.HOST)
        if host >= 0 and seq_map.size and not np.array_equal(seq_map, np.arange(seq_map.size)):
            seq_id = seq_id.copy()
            is_host = table.op_type == host
            seq_id[is_host] = seq_map[table.seq_id[is_host]]
        seq_id_parts.append(seq_id)
    tables = [table for table, _ in parts]
    columns = {
        name: np.concatenate([getattr(t, name) for t in tables]).astype(dtype, copy=False)
        for name, dtype in OpTable.COLUMNS.items()
        if name not in ("op_type", "seq_id", "seq_sq")
    }
    joined = OpTable(
        op_types=tuple(op_types),
        op_type=np.concatenate(op_type_parts).astype(np.int16, copy=False),
        seq_id=np.concatenate(seq_id_parts).astype(np.int32, copy=False),
        seq_sq=np.concatenate([_seq_sq(t) for t in tables]),
        ends_at_last_op=all(t.ends_at_last_op for t in tables),
        **columns,
    )
    return joined, labels


def drop_unused_types(table: OpTable) -> OpTable:
    """The table without op types none of its rows has (they fell out of a sliding window): a
    table built over the same rows would not list them."""
    counts = np.bincount(table.op_type, minlength=len(table.op_types)) if len(table) else np.zeros(0)
    used = np.flatnonzero(counts[: len(table.op_types)])
    if used.size == len(table.op_types):
        return table
    renumber = np.full(len(table.op_types), -1, dtype=np.int16)
    renumber[used] = np.arange(used.size, dtype=np.int16)
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
        ends_at_last_op=table.ends_at_last_op,
    )


def _seq_sq(table: OpTable) -> np.ndarray:
    return table.seq_sq if table.seq_sq.shape[0] == len(table) else np.full(len(table), np.nan)
