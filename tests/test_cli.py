"""The `smon` console script as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from smon_server.store import migrate
from smon_server.store.db import Database
from tests.conftest import shared_dir, skip_or_fail


def smon(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "smon"  # the console script beside this interpreter
    assert exe.exists(), "the smon console script is not installed"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, check=False)


def test_db_upgrade_migrates_to_head(database_url: str) -> None:
    done = smon("db", "upgrade", "--db", database_url)
    assert done.returncode == 0, done.stderr
    db = Database(database_url)
    try:
        head = migrate.current_revision(db)
    finally:
        db.dispose()
    assert head is not None and f"revision {head}" in done.stdout


def test_analyze_json_prints_the_summary_object(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = shared_dir() / "conformance" / "whatif"
    if not (folder / "trace-ST.parquet").exists():
        skip_or_fail(f"conformance traces not found in {folder}")
    done = smon("analyze", str(folder / "trace-ST.parquet"), "--meta", str(folder / "meta-ST.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    expected = json.loads((folder / "result-ST.json").read_text())["blocking_slowdown"]
    assert summary["slowdown"] == pytest.approx(expected, rel=0.01)
    assert summary["diagnoses"][0]["cause"] == "stage_imbalance"

    # `smon demo` prints a summary of this same shape: its renderer reads every field it shows.
    from rich.console import Console

    from smon_server.demo import runner

    console = Console(record=True, width=200)
    monkeypatch.setattr(runner, "console", console)
    runner.render_summary(summary)
    shown = console.export_text()
    assert f"slowdown {summary['slowdown']:.2f}x" in shown and "Diagnosis: stage_imbalance" in shown


def test_analyze_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    done = smon("analyze", str(tmp_path / "nope.parquet"))
    assert done.returncode != 0
    assert "nope.parquet" in done.stderr
    assert "Traceback" not in done.stderr
