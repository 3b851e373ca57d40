"""Outside programs the tests drive (promtool, Chromium): found, installed under CI, or skipped."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess

import pytest


def debian_tool(command: str, package: str) -> str:
    """The path of `command`. Missing: under CI=true the Debian `package` is installed (the test
    set-up must not rely on anything installed by hand); elsewhere the test is skipped, saying how
    to get it."""
    found = shutil.which(command)
    if found:
        return found
    if os.environ.get("CI") != "true":
        pytest.skip(f"{command} is not installed (Debian package {package!r}; CI installs it)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Test processes run side by side (pytest-xdist): one installs, the others wait and find it.
    with open("/tmp/smon-tests-apt.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shutil.which(command):
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
                check=True,
                env=env,
                capture_output=True,
            )
    found = shutil.which(command)
    if not found:
        pytest.fail(f"installed Debian package {package!r} but {command} is still not on PATH")
    return found
