"""Small helpers to write op tables by hand in tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from smon_server.whatif.ops import OpTable


@dataclass(frozen=True)
class Op:
    dp: int
    stage: int
    step: int
    op: str
    seq: int
    start: float
    duration: float
    microbatch: int = -1
    chunk: int = 0
    rank: int = -1
    seq_sq: float = float("nan")


def table(ops: Sequence[Op]) -> OpTable:
    names = tuple(dict.fromkeys(o.op for o in ops))
    return OpTable(
        op_types=names,
        dp_rank=np.array([o.dp for o in ops], dtype=np.int32),
        stage=np.array([o.stage for o in ops], dtype=np.int32),
        step=np.array([o.step for o in ops], dtype=np.int64),
        op_type=np.array([names.index(o.op) for o in ops], dtype=np.int32),
        seq_id=np.array([o.seq for o in ops], dtype=np.int32),
        chunk=np.array([o.chunk for o in ops], dtype=np.int16),
        microbatch=np.array([o.microbatch for o in ops], dtype=np.int16),
        start=np.array([o.start for o in ops], dtype=np.float64),
        duration=np.array([o.duration for o in ops], dtype=np.float64),
        rank=np.array([o.rank if o.rank >= 0 else o.dp + 100 * o.stage for o in ops], dtype=np.int32),
        seq_sq=np.array([o.seq_sq for o in ops], dtype=np.float64),
    )


def data_parallel_step(
    step: int,
    forward: Sequence[float],
    *,
    backward: float,
    transfer: float,
    optimizer: float,
    origin: float = 0.0,
) -> list[Op]:
    """One pure-DP step as it is recorded: forward, backward, an all-reduce that ends for everyone
    `transfer` after the last rank joins, optimizer."""
    joins = [f + backward for f in forward]
    done = max(joins) + transfer
    ops = []
    for dp, f in enumerate(forward):
        ops += [
            Op(dp, 0, step, "forward-compute", 0, origin, f),
            Op(dp, 0, step, "backward-compute", 0, origin + f, backward),
            Op(dp, 0, step, "grads-all-reduce", 0, origin + joins[dp], done - joins[dp]),
            Op(dp, 0, step, "optimizer", 0, origin + done, optimizer),
        ]
    return ops
