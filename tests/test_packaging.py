"""What `pip install` users get: the wheel carries the dashboard as `make web` built it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from smon_server import dashboard

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_ships_the_built_dashboard(tmp_path: Path) -> None:
    if not dashboard.is_built():
        pytest.fail("the dashboard is not built: run `make web` (make test does)")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("smon-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    built = {
        f"smon_server/dashboard/dist/{p.relative_to(dashboard.DIST).as_posix()}"
        for p in dashboard.DIST.rglob("*")
        if p.is_file()
    }
    assert "smon_server/dashboard/dist/index.html" in built
    assert any(n.endswith(".js") for n in built) and any(n.endswith(".css") for n in built)
    assert built <= names, built - names
    # Sources and tooling stay out of the wheel.
    assert not any(n.startswith("web/") or "node_modules" in n for n in names)
