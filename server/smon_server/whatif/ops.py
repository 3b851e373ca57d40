"""The operation table: the one input of the what-if engine, whatever the data came from.

Agent step records (live jobs) and per-op trace files (offline `smon analyze`) are both turned
into this columnar table; the simulator, attribution and diagnosis only ever read it. Columns are
numpy arrays of equal length, one row per operation (DESIGN §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

# Op type names (DESIGN §5). Compute op types idealise to their mean duration, communication op
# types to the median of their transfer time. Any other name (custom phases, h2d, checkpoint)
# is treated as compute on the worker's own stream.
FORWARD_COMPUTE = "forward-compute"
BACKWARD_COMPUTE = "backward-compute"
FORWARD_SEND = "forward-send"
FORWARD_RECV = "forward-recv"
BACKWARD_SEND = "backward-send"
BACKWARD_RECV = "backward-recv"
PARAMS_ALL_GATHER = "params-all-gather"
GRADS_REDUCE_SCATTER = "grads-reduce-scatter"
GRADS_ALL_REDUCE = "grads-all-reduce"
SEPARATE_GRADS_ALL_REDUCE = "separate-grads-all-reduce"
LAYERNORM_GRADS_ALL_REDUCE = "layernorm-grads-all-reduce"
EMBEDDING_GRADS_ALL_REDUCE = "embedding-grads-all-reduce"
OPTIMIZER_CLIP_MAIN_GRAD = "optimizer-clip-main-grad"
OPTIMIZER = "optimizer"
GC = "gc"
DATA_WAIT = "data_wait"
CHECKPOINT = "checkpoint"
# The part of a step no timed phase covers (logging, evaluation, clipping, sleeps): DESIGN §5.
HOST = "host"

P2P_OP_TYPES = frozenset({FORWARD_SEND, FORWARD_RECV, BACKWARD_SEND, BACKWARD_RECV})
COLLECTIVE_OP_TYPES = frozenset(
    {
        PARAMS_ALL_GATHER,
        GRADS_REDUCE_SCATTER,
        GRADS_ALL_REDUCE,
        SEPARATE_GRADS_ALL_REDUCE,
        LAYERNORM_GRADS_ALL_REDUCE,
        EMBEDDING_GRADS_ALL_REDUCE,
        OPTIMIZER_CLIP_MAIN_GRAD,
    }
)
COMMUNICATION_OP_TYPES = P2P_OP_TYPES | COLLECTIVE_OP_TYPES


@dataclass(frozen=True)
class OpTable:
    """One row per operation. A worker is one (dp_rank, stage) pair.

    `op_type` holds indices into `op_types`, so custom phase names cost nothing per row.
    `start` is on one clock for all workers (seconds; any origin); `duration` in seconds.
    `microbatch` is -1 where an op is not per micro-batch; `seq_sq` is Σ len² of the op's
    micro-batch (or step) where the agent recorded sequence lengths, NaN elsewhere.
    `rank` is the global rank the row came from (for per-rank views), -1 when unknown.
    """

    op_types: tuple[str, ...]
    dp_rank: np.ndarray  # int32
    stage: np.ndarray  # int32
    step: np.ndarray  # int64
    op_type: np.ndarray  # int32, index into op_types (a job may name thousands of phases)
    seq_id: np.ndarray  # int32, order of this op type within the step on this worker
    chunk: np.ndarray  # int16, model chunk within the stage
    microbatch: np.ndarray  # int16
    start: np.ndarray  # float64
    duration: np.ndarray  # float64
    rank: np.ndarray  # int32
    seq_sq: np.ndarray = field(default_factory=lambda: np.empty(0))  # float64, or empty
    # A device-timed op's host issue time (whatif/inputs/host_line.py): NaN where the op has none, empty
    # when no op has one. Not in COLUMNS: CPU jobs, and window caches of them, carry none.
    host_duration: np.ndarray = field(default_factory=lambda: np.empty(0))
    # True for tables built from step records, which cover each step whole: the step ends where
    # its last op ends. Traces end a step at the latest optimizer end (the paper's definition).
    ends_at_last_op: bool = False

    # The per-row columns and their dtypes, for code that builds or copies tables column-wise.
    COLUMNS: ClassVar[dict[str, type[np.generic]]] = {
        "dp_rank": np.int32,
        "stage": np.int32,
        "step": np.int64,
        "op_type": np.int32,
        "seq_id": np.int32,
        "chunk": np.int16,
        "microbatch": np.int16,
        "start": np.float64,
        "duration": np.float64,
        "rank": np.int32,
        "seq_sq": np.float64,
    }

    def __len__(self) -> int:
        return int(self.duration.shape[0])

    def code(self, name: str) -> int:
        """Index of an op type name, -1 when the table has no such op type."""
        try:
            return self.op_types.index(name)
        except ValueError:
            return -1

    def take(self, rows: np.ndarray | slice) -> OpTable:
        """The same table restricted to `rows` (a boolean mask, an index array, or a slice: views)."""
        return OpTable(
            op_types=self.op_types,
            dp_rank=self.dp_rank[rows],
            stage=self.stage[rows],
            step=self.step[rows],
            op_type=self.op_type[rows],
            seq_id=self.seq_id[rows],
            chunk=self.chunk[rows],
            microbatch=self.microbatch[rows],
            start=self.start[rows],
            duration=self.duration[rows],
            rank=self.rank[rows],
            seq_sq=self.seq_sq[rows] if self.seq_sq.shape[0] == len(self) else self.seq_sq,
            host_duration=self.host_duration[rows] if self.has_host else self.host_duration,
            ends_at_last_op=self.ends_at_last_op,
        )

    def since(self, step: int) -> OpTable:
        """The rows of steps >= `step`: views from the first of them when every row after it is
        one of them (rows in step order, as step_table.convert makes them), else a copy. A copy
        of a 64-rank window's columns, to cut its recent stretch, was a tenth of its analysis."""
        rows = self.step >= step
        first = int(np.argmax(rows)) if rows.any() else len(rows)
        if rows[first:].all():
            return self if first == 0 else self.take(slice(first, None))
        return self.take(rows)

    @property
    def has_host(self) -> bool:
        return bool(len(self)) and self.host_duration.shape[0] == len(self)


def p2p_family(op_type: str) -> str:
    """Attribution name of an op type: the four p2p kinds fold into forward- / backward-pp-comm.

    A combined Megatron call (send_forward_recv_backward) is recorded as a forward-send and a
    backward-recv; grouping by direction keeps both halves of one transfer under one name.
    """
    if op_type in (FORWARD_SEND, FORWARD_RECV):
        return "forward-pp-comm"
    if op_type in (BACKWARD_SEND, BACKWARD_RECV):
        return "backward-pp-comm"
    return op_type
