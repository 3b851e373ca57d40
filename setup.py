"""Package discovery for SMon's three source roots; pyproject.toml holds everything else.

The agent (agent/smon), the server (server/smon_server) and the Alembic migrations (migrations/,
shipped as smon_server.migrations so `smon db upgrade` works from an installed wheel) each live in
their own folder, mapped by pyproject's [tool.setuptools.package-dir]. `packages.find` there cannot
name a folder's packages after another name (migrations/versions is smon_server.migrations.versions),
so the packages are found here instead: every folder below each mapped root, data folders (the
dashboard's build) included. A new package is in the wheel without anyone listing it.
"""

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

PACKAGE_DIR: dict[str, str] = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]


def packages() -> list[str]:
    found: set[str] = set()
    for name, folder in PACKAGE_DIR.items():
        found.add(name)
        below = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
        found.update(f"{name}.{sub}" for sub in below)
    return sorted(found)


setup(packages=packages())
