"""Fixtures for the analysis tests: the conformance traces (skipped when absent, failed under CI)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from smon_server.whatif.diagnosis import Diagnosis, diagnose
from smon_server.whatif.engine import WhatIfResult, analyze
from smon_server.whatif.inputs.trace import load_trace
from smon_server.whatif.ops import OpTable

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES = ("AR", "ST", "SE")


def conformance_dir() -> Path:
    return Path(
        os.environ.get("SMON_CONFORMANCE_DIR", REPO_ROOT.parent / "shared" / "conformance" / "whatif")
    )


def require_conformance() -> Path:
    d = conformance_dir()
    if not all((d / f"result-{x}.json").exists() and (d / f"trace-{x}.parquet").exists() for x in TRACES):
        reason = f"conformance traces not found in {d} (set SMON_CONFORMANCE_DIR)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI=true requires them")
        pytest.skip(reason)
    return d


@dataclass(frozen=True)
class Conformance:
    name: str
    table: OpTable
    result: WhatIfResult
    diagnoses: list[Diagnosis]
    expected: dict[str, Any]  # result-X.json
    mw: dict[str, Any]
    ms: dict[str, Any]


_cache: dict[str, Conformance] = {}


@pytest.fixture(params=TRACES)
def conformance(request: pytest.FixtureRequest) -> Conformance:
    name = str(request.param)
    if name not in _cache:
        d = require_conformance()
        loaded = load_trace(d / f"trace-{name}.parquet", d / f"meta-{name}.yaml")
        result = analyze(loaded.table)
        _cache[name] = Conformance(
            name=name,
            table=loaded.table,
            result=result,
            diagnoses=diagnose(loaded.table, result),
            expected=json.loads((d / f"result-{name}.json").read_text()),
            mw=json.loads((d / f"mw-{name}.json").read_text()),
            ms=json.loads((d / f"ms-{name}.json").read_text()),
        )
    return _cache[name]
