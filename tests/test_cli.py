"""The `smon` console script as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from smon_server.store import migrate
from smon_server.store.db import Database
from tests.support.paths import shared_dir, skip_or_fail
from tests.support.server_process import free_port


def smon(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "smon"  # the console script beside this interpreter
    assert exe.exists(), "the smon console script is not installed"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_db_upgrade_migrates_to_head(empty_database_url: str) -> None:
    done = smon("db", "upgrade", "--db", empty_database_url)
    assert done.returncode == 0, done.stderr
    db = Database(empty_database_url)
    try:
        head = migrate.current_revision(db)
    finally:
        db.dispose()
    assert head is not None and f"revision {head}" in done.stdout


def test_an_unreachable_database_is_one_clear_line() -> None:
    # Nothing listens on that port: what an operator sees when the database is not up yet.
    url = f"postgresql://smon:secret@127.0.0.1:{free_port()}/smon"
    for command in (
        ("db", "upgrade", "--db", url),
        ("server", "--db", url, "--http-port", "0", "--grpc-port", "0"),
    ):
        done = smon(*command)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and "secret" not in done.stderr, done.stderr
        [line] = [line for line in done.stderr.splitlines() if line.startswith("smon:")]
        assert line.startswith("smon: cannot use the database postgresql+psycopg://smon:***@127.0.0.1:"), line


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
    # The evidence as sentences (views/evidence.py), never the object itself.
    stage = summary["diagnoses"][0]["evidence"]["stage"]
    assert f"Stage {stage} computes" in shown and "{" not in shown and "compute_ratio" not in shown


def test_analyze_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    done = smon("analyze", str(tmp_path / "nope.parquet"))
    assert done.returncode != 0
    assert "nope.parquet" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.torch
def test_demo_tells_what_it_found_and_ends_on_the_jobs_dashboard(tmp_path: Path) -> None:
    """The newcomer's first command, shortened: 2 ranks, rank 1 slowed by 50 ms per forward."""
    http, grpc = free_port(), free_port()
    done = smon(
        "demo", "--no-wait", "--ranks", "2", "--steps", "40", "--slow-rank", "1", "--delay", "0.05",
        "--db", f"sqlite:///{tmp_path / 'demo.db'}", "--http-port", str(http), "--grpc-port", str(grpc),
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    job = re.search(r"Training job (demo-[\d-]+):", out)
    assert job, out
    assert out.rstrip().splitlines()[-1].strip() == f"http://127.0.0.1:{http}/jobs/{job[1]}"
    diagnosis = out[out.index("Diagnosis: slow_worker") : out.index("What to do:")]
    assert "Rank 1" in diagnosis and "computes" in diagnosis, diagnosis
    assert not re.search(r"[{}]|\w_\w", diagnosis.split("\n", 1)[1]), diagnosis  # sentences, no object
