"""Joining op tables (whatif/inputs/merge.py): host times and op type numbers as one build gives."""

from __future__ import annotations

import numpy as np

from smon_server.whatif.inputs.merge import join_tables
from smon_server.whatif.ops import OpTable


def _table(types: tuple[str, ...], codes: list[int], host: list[float] | None) -> OpTable:
    n = len(codes)
    ints = np.arange(n, dtype=np.int32)
    return OpTable(
        op_types=types,
        dp_rank=ints,
        stage=np.zeros(n, np.int32),
        step=np.arange(n, dtype=np.int64),
        op_type=np.array(codes, np.int32),
        seq_id=np.zeros(n, np.int32),
        chunk=np.zeros(n, np.int16),
        microbatch=np.full(n, -1, np.int16),
        start=np.arange(n, dtype=np.float64),
        duration=np.ones(n),
        rank=ints,
        host_duration=np.empty(0) if host is None else np.array(host),
    )


def test_join_keeps_host_times_only_where_some_part_has_them() -> None:
    plain = _table(("forward", "backward"), [0, 1], None)
    joined, _ = join_tables([(plain, []), (_table(("forward", "backward"), [1, 0], None), [])])
    assert joined.host_duration.size == 0
    assert joined.op_types == ("forward", "backward")
    assert joined.op_type.tolist() == [0, 1, 1, 0]
    timed = _table(("backward", "optimizer"), [0, 1], [0.5, np.nan])
    joined, _ = join_tables([(plain, []), (timed, [])])
    assert joined.op_types == ("forward", "backward", "optimizer")
    assert joined.op_type.tolist() == [0, 1, 1, 2]  # the second part renumbered onto the first's
    assert np.isnan(joined.host_duration[[0, 1, 3]]).all() and joined.host_duration[2] == 0.5
    untimed = _table(("forward",), [0], [np.nan])
    joined, _ = join_tables([(plain, []), (untimed, [])])
    assert joined.host_duration.size == 0  # NaN everywhere: none
