"""Per-op trace files (the conformance parquet schema) and their job metadata, as an `OpTable`.

The schema is the one of the paper's published traces: one row per op with `dp_rank`, `stage`,
`step`, `optype`, `start_ts` (relative to the step's start), `duration` (seconds), `seq_id`, and
optionally `rank`, `mc` (model chunk), `mb_id` (micro-batch) and `gmc`. Rows with a missing,
NaN or negative time are dropped and counted, never silently kept: one bad row must not poison
a step's simulation, and the rest of the file is still worth analysing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smon_server.whatif.ops import OpTable

REQUIRED_COLUMNS = ("dp_rank", "stage", "step", "optype", "start_ts", "duration", "seq_id")


class TraceError(ValueError):
    """A trace or meta file that cannot be analysed (missing, unreadable, wrong schema)."""


@dataclass(frozen=True)
class JobMeta:
    """Parallel layout of the traced job (the conformance `meta-X.yaml`)."""

    name: str = ""
    dp_size: int = 1
    pp_size: int = 1
    tp_size: int = 1
    cp_size: int = 1  # `dsp_size` in the artifact: context parallel
    vpp_size: int = 1
    world_size: int = 0  # 0: unknown


@dataclass(frozen=True)
class LoadedTrace:
    name: str
    table: OpTable
    meta: JobMeta | None
    rows_read: int
    rows_rejected: int  # NaN / negative / missing times


def load_meta(path: str | Path) -> JobMeta:
    import yaml

    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as e:
        raise TraceError(f"cannot read meta file {p}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise TraceError(f"meta file {p} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise TraceError(f"meta file {p} must be a mapping of sizes, got {type(raw).__name__}")

    def size(key: str, default: int) -> int:
        value = raw.get(key, default)
        try:
            n = int(value)
        except (TypeError, ValueError) as e:
            raise TraceError(f"meta file {p}: {key} must be an integer, got {value!r}") from e
        if n < 0:
            raise TraceError(f"meta file {p}: {key} must not be negative, got {n}")
        return n

    return JobMeta(
        name=str(raw.get("trial_name", raw.get("name", ""))),
        dp_size=size("dp_size", 1),
        pp_size=size("pp_size", 1),
        tp_size=size("tp_size", 1),
        cp_size=size("dsp_size", size("cp_size", 1)),
        vpp_size=size("vpp_size", 1),
        world_size=size("world_size", 0),
    )


def trace_name(path: str | Path) -> str:
    """`trace-AR.parquet` -> `AR`; any other file name -> its stem."""
    stem = Path(path).name.split(".")[0]
    return stem.removeprefix("trace-") or stem


def load_trace(path: str | Path, meta_path: str | Path | None = None) -> LoadedTrace:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    try:
        table = pq.read_table(p)
    except FileNotFoundError as e:
        raise TraceError(f"trace file {p} does not exist") from e
    except (OSError, pa.ArrowException) as e:
        raise TraceError(f"cannot read {p} as parquet: {e}") from e
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(
            f"trace {p} lacks column(s) {', '.join(missing)}; "
            f"the per-op schema needs {', '.join(REQUIRED_COLUMNS)}"
        )

    def ints(name: str, dtype: type, default: int | None = None) -> np.ndarray:
        if name not in table.column_names:
            return np.full(table.num_rows, default if default is not None else -1, dtype=dtype)
        col = table.column(name).combine_chunks()
        if col.null_count:
            col = col.fill_null(-1)
        try:
            return np.asarray(col.to_numpy(zero_copy_only=False)).astype(dtype)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise TraceError(f"trace {p}: column {name} must be integer: {e}") from e

    def floats(name: str) -> np.ndarray:
        col = table.column(name).combine_chunks()
        try:
            values = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise TraceError(f"trace {p}: column {name} must be numeric: {e}") from e
        return values  # nulls arrive as NaN

    op_types, op_type = _op_type_codes(table.column("optype").combine_chunks(), p)
    start = floats("start_ts")
    duration = floats("duration")
    dp_rank = ints("dp_rank", np.int32)
    stage = ints("stage", np.int32)
    step = ints("step", np.int64)
    seq_id = ints("seq_id", np.int32)
    bad = ~np.isfinite(start) | ~np.isfinite(duration) | (duration < 0) | (op_type < 0)
    bad |= (dp_rank < 0) | (stage < 0) | (seq_id < 0)
    chunk = ints("mc", np.int16, 0)
    ops = OpTable(
        op_types=op_types,
        dp_rank=dp_rank,
        stage=stage,
        step=step,
        op_type=op_type,
        seq_id=seq_id,
        chunk=np.maximum(chunk, 0).astype(np.int16),
        microbatch=ints("mb_id", np.int16),
        start=start,
        duration=duration,
        rank=ints("rank", np.int32),
    )
    n_bad = int(bad.sum())
    if n_bad:
        ops = ops.take(~bad)
    meta = load_meta(meta_path) if meta_path is not None else None
    return LoadedTrace(
        name=trace_name(p), table=ops, meta=meta, rows_read=table.num_rows, rows_rejected=n_bad
    )


def _op_type_codes(col: object, path: Path) -> tuple[tuple[str, ...], np.ndarray]:
    """Op type names and per-row codes (-1 for a null name), without a Python string per row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = col if isinstance(col, pa.DictionaryArray) else None
    if arr is None:
        try:
            arr = pc.dictionary_encode(col)
        except pa.ArrowException as e:
            raise TraceError(f"trace {path}: column optype must hold names: {e}") from e
    names = tuple(str(x) for x in arr.dictionary.to_pylist())
    codes = np.asarray(arr.indices.fill_null(-1).to_numpy(zero_copy_only=False)).astype(np.int32)
    return names, codes
