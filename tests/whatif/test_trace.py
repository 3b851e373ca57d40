"""Loading per-op trace files and their meta YAML, with clear errors for bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smon_server.whatif.inputs.trace import TraceError, load_meta, load_trace, trace_name


def write_trace(path: Path, **overrides: object) -> Path:
    n = 6
    columns: dict[str, object] = {
        "dp_rank": np.zeros(n, dtype=np.int8),
        "stage": np.zeros(n, dtype=np.int8),
        "rank": np.zeros(n, dtype=np.int16),
        "step": np.repeat([1, 2], 3),
        "optype": pa.array(["forward-compute", "backward-compute", "optimizer"] * 2).dictionary_encode(),
        "start_ts": np.array([0.0, 0.1, 0.3] * 2, dtype=np.float32),
        "duration": np.array([0.1, 0.2, 0.05] * 2, dtype=np.float32),
        "seq_id": np.zeros(n, dtype=np.int32),
        "mc": np.zeros(n, dtype=np.int8),
        "mb_id": np.zeros(n, dtype=np.int8),
    }
    columns.update(overrides)
    columns = {k: v for k, v in columns.items() if v is not None}
    pq.write_table(pa.table(columns), path)
    return path


def test_loads_and_counts_bad_rows(tmp_path: Path) -> None:
    duration = np.array([0.1, np.nan, 0.05, 0.1, -0.2, 0.05], dtype=np.float32)
    start = np.array([0.0, 0.1, 0.3, np.nan, 0.1, 0.3], dtype=np.float32)
    loaded = load_trace(write_trace(tmp_path / "trace-X.parquet", duration=duration, start_ts=start))
    assert loaded.name == "X"
    assert loaded.rows_read == 6
    assert loaded.rows_rejected == 3
    assert len(loaded.table) == 3
    assert np.all(np.isfinite(loaded.table.duration)) and np.all(loaded.table.duration >= 0)
    assert loaded.table.op_types[loaded.table.op_type[0]] == "forward-compute"


def test_plain_string_op_types_and_optional_columns(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path / "t.parquet",
        optype=["forward-compute", "backward-compute", "optimizer"] * 2,
        rank=None,
        mc=None,
        mb_id=None,
    )
    loaded = load_trace(path)
    assert len(loaded.table) == 6
    assert loaded.table.rank.tolist() == [-1] * 6
    assert trace_name(path) == "t"


def test_missing_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="duration"):
        load_trace(write_trace(tmp_path / "t.parquet", duration=None))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.parquet")
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(TraceError, match="parquet"):
        load_trace(junk)


def test_meta(tmp_path: Path) -> None:
    meta = tmp_path / "meta.yaml"
    meta.write_text(
        "trial_name: X\ndp_size: 4\npp_size: 2\ntp_size: 8\ndsp_size: 2\nvpp_size: 1\nworld_size: 128\n"
    )
    m = load_meta(meta)
    assert (m.name, m.dp_size, m.pp_size, m.tp_size, m.cp_size, m.world_size) == ("X", 4, 2, 8, 2, 128)
    meta.write_text("- a list\n")
    with pytest.raises(TraceError, match="mapping"):
        load_meta(meta)
    meta.write_text("dp_size: many\n")
    with pytest.raises(TraceError, match="dp_size"):
        load_meta(meta)
    meta.write_text("dp_size: [\n")
    with pytest.raises(TraceError, match="YAML"):
        load_meta(meta)
    with pytest.raises(TraceError, match="cannot read"):
        load_meta(tmp_path / "absent.yaml")
