"""The engine is pure: importing any of its modules must not pull in the store, the API, the
settings or SQLAlchemy (that is what lets `smon analyze` and the server share it unchanged)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import smon_server.whatif as whatif

FORBIDDEN = ("smon_server.store", "smon_server.api", "smon_server.settings", "smon_server.jobs", "sqlalchemy")


def engine_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(whatif.__path__, prefix="smon_server.whatif.")]


def test_engine_imports_nothing_above_it() -> None:
    modules = engine_modules()
    assert "smon_server.whatif.engine" in modules and "smon_server.whatif.diagnosis.run" in modules
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the engine imports {out.stdout.strip()}"


def test_store_imports_nothing_above_it() -> None:
    probe = (
        "import sys, smon_server.store.queries, smon_server.store.writes\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('smon_server.whatif', 'smon_server.ingest',"
        " 'smon_server.jobs', 'smon_server.api')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the store imports {out.stdout.strip()}"
