"""SMon installed as users install it: the wheel the image builds holds every file of the
package, the server runs from it as the image runs it, `smon db upgrade` migrates PostgreSQL from
it, and the agent alone (no extras) ships a torch job's steps without any server dependency."""

from __future__ import annotations

import json
import re
import subprocess
import time
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from smon_server import dashboard
from tests.install.conftest import InstalledServer, Venv, clean_env, run
from tests.support.paths import REPO_ROOT
from tests.support.tools import debian_tool

pytestmark = [pytest.mark.slow, pytest.mark.parallel]  # installs and answers: no timing

STEPS = 30

# A training loop that has no model to hook: each step ends at mon.step() (the server extra has
# no torch).
PLAIN_JOB = """
import json, sys, time
import smon

mon = smon.attach(nvml_interval=0)
for _ in range(int(sys.argv[1])):
    time.sleep(0.01)
    mon.step()
mon.close()
print(json.dumps(mon.counters()))
"""

# The README's one line in a one-rank torch loop.
TORCH_JOB = """
import json, sys, time
import torch
from torch import nn
import smon

steps = int(sys.argv[1])
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(8 * steps, 16), torch.randn(8 * steps, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8)

mon = smon.attach(model=model, optimizer=optimizer, dataloader=loader)  # the one line

for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    time.sleep(0.01)
    optimizer.step()
mon.close()
print(json.dumps(mon.counters()))
"""


def package_dir() -> dict[str, str]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return dict(pyproject["tool"]["setuptools"]["package-dir"])


def test_the_wheel_ships_every_file_of_the_packages(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected: set[str] = set()
    for package, folder in package_dir().items():
        prefix = package.replace(".", "/")
        tracked = run(["git", "ls-files", "--", folder], cwd=REPO_ROOT).split()
        expected |= {f"{prefix}/{Path(name).relative_to(folder).as_posix()}" for name in tracked}
    built = {
        f"smon_server/dashboard/dist/{p.relative_to(dashboard.DIST).as_posix()}"
        for p in dashboard.DIST.rglob("*")
        if p.is_file()
    }
    assert "smon_server/dashboard/dist/index.html" in built
    assert any(n.endswith(".js") for n in built) and any(n.endswith(".css") for n in built)
    # The packages the issue found missing, spelled out: a wrong mapping would lose them all.
    assert {"smon_server/alerts/notifiers/__init__.py", "smon/v1/ingest.proto"} <= expected
    assert any(n.startswith("smon_server/migrations/versions/") for n in expected)
    assert expected | built <= names, sorted((expected | built) - names)
    # Nothing else: no sources of the dashboard, tests, caches or stale build output.
    extra = {n for n in names - expected - built if not n.startswith("smon-0.1.0.dist-info/")}
    assert not extra, sorted(extra)


def test_the_server_runs_from_the_wheel_as_the_image_runs_it(
    installed_server: InstalledServer, server_venv: Venv
) -> None:
    # Everything comes from the environment's site-packages, nothing from the checkout.
    code = (
        "import json, sys, smon, smon_server, smon_server.alerts.notifiers, smon_server.migrations;"
        "print(json.dumps([smon.__file__, smon_server.__file__, smon_server.migrations.__file__, sys.path]))"
    )
    *files, path = json.loads(run([server_venv.python, "-c", code], cwd=installed_server.home))
    site = str(server_venv.path / "lib")
    assert all(f.startswith(site) for f in files), files
    assert not [p for p in path if p.startswith(str(REPO_ROOT))], path
    # The image's default database: the embedded SQLite file under the server's home.
    assert (installed_server.home / ".local/share/smon/smon.db").is_file()
    assert installed_server.get("/healthz").json() == {"status": "ok"}
    page = installed_server.get("/").text
    assets = re.findall(r'(?:src|href)="(/assets/[^"]+)"', page)
    assert assets, page[:500]
    for asset in assets:
        installed_server.get(asset)  # the dashboard the wheel ships, served

    # A one-rank job, its agent from the same environment (the server extra has no torch).
    (installed_server.home / "plain_job.py").write_text(PLAIN_JOB)
    env = clean_env(SMON_SERVER=installed_server.grpc_target, SMON_JOB="wheel-plain")
    counters = json.loads(
        run([server_venv.python, "plain_job.py", str(STEPS)], cwd=installed_server.home, env=env)
    )
    assert counters["acked_batches"] >= 1 and counters["errors"] == 0, counters
    steps = steps_of(installed_server, "wheel-plain", STEPS)
    assert all(s["step_time"] >= 0.01 for s in steps), steps


def test_the_agent_alone_ships_a_torch_job_without_server_dependencies(
    agent_venv: Venv, installed_server: InstalledServer, wheel: Path
) -> None:
    metadata = Parser().parsestr(zipfile.ZipFile(wheel).read("smon-0.1.0.dist-info/METADATA").decode())
    requires = metadata.get_all("Requires-Dist") or []
    names = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requires]
    core = {n for n, r in zip(names, requires, strict=True) if "extra ==" not in r}
    server = {n for n, r in zip(names, requires, strict=True) if 'extra == "server"' in r}
    assert core == {"grpcio", "protobuf", "nvidia-ml-py"}
    # The server extra's packages are not even installed (torch pulls none of them).
    code = (
        "import importlib.metadata as m, json, sys;"
        "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))"
    )
    installed = set(json.loads(run([agent_venv.python, "-c", code], cwd=installed_server.home)))
    assert {"smon", "torch", *core} <= installed
    assert not server & installed, server & installed

    (installed_server.home / "torch_job.py").write_text(TORCH_JOB)
    env = clean_env(SMON_SERVER=installed_server.grpc_target, SMON_JOB="wheel-torch")
    counters = json.loads(
        run([agent_venv.python, "torch_job.py", str(STEPS)], cwd=installed_server.home, env=env).splitlines()[
            -1
        ]
    )
    assert counters["acked_batches"] >= 1 and counters["errors"] == 0, counters
    steps = steps_of(installed_server, "wheel-torch", STEPS)
    assert all(s["step_time"] >= 0.01 for s in steps), steps

    # The `smon` command is there too; without the server extra it says how to get it.
    done = subprocess.run(
        [agent_venv.bin("smon"), "server"],
        cwd=installed_server.home,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "pip install 'smon[server]'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_installed_metrics_pass_promtool(installed_server: InstalledServer) -> None:
    promtool = debian_tool("promtool", "prometheus")
    exposition = installed_server.get("/metrics").content
    assert b"smon_ingest_records_total" in exposition
    done = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
        done.stdout + done.stderr
    ).decode()


def test_db_upgrade_from_the_wheel_migrates_postgresql(
    server_venv: Venv, postgres_url: str, tmp_path: Path
) -> None:
    out = run([server_venv.bin("smon"), "db", "upgrade", "--db", postgres_url], cwd=tmp_path)
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as connection:
            [revision] = connection.execute(text("SELECT version_num FROM alembic_version")).scalars()
            tables = set(
                connection.execute(
                    text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
                ).scalars()
            )
    finally:
        engine.dispose()
    assert revision == head_revision() and f"at revision {revision}" in out, out
    assert {"jobs", "step_records"} <= tables, tables


def head_revision() -> str:
    """The newest migration in the checkout (the wheel must ship them all to reach it)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(REPO_ROOT / "migrations")).get_current_head()
    assert head is not None
    return head


def steps_of(server: InstalledServer, job: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The job's steps through the REST API, once every step after its warm-up is there."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        try:
            warmup = server.get(f"/api/v1/jobs/{job}/summary").json()["warmup_steps"]
            seen = server.get(f"/api/v1/jobs/{job}/steps").json()["steps"]
        except httpx.HTTPStatusError as exc:  # 404 until the server has heard of the job
            seen = exc.response.text
        else:
            if [s["step"] for s in seen] == list(range(warmup, count)):
                return list(seen)
        time.sleep(0.5)
    pytest.fail(f"job {job}: steps {len(seen) if isinstance(seen, list) else seen} after {timeout:.0f} s")
