"""Where the tests find the repository and the shared data, and how a missing dependency reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip loudly on a developer machine; under CI=true a missing dependency is a failure."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: required)")
    pytest.skip(reason)


def shared_dir() -> Path:
    return Path(os.environ.get("SMON_SHARED_DIR", REPO_ROOT.parent / "shared"))
