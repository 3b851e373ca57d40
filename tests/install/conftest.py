"""SMon as users install it, never from the checkout: one wheel built by the image's recipe
(tests/install/recipe.py reads it from the Dockerfile) from a clean copy of the tree, and fresh
virtual environments holding that wheel, with no editable path and no PYTHONPATH.

The two environments (the server extra; the agent alone with torch) are installed side by side
while the first test runs. Their dependencies are resolved against the package index like any
`pip install` (`pip download`), kept in pytest's cache folder between runs (this machine's
registry mirror sends no caching headers, so pip's own cache keeps nothing), and installed from
there with `--no-index`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from smon_server import dashboard
from tests.install import recipe
from tests.support.paths import REPO_ROOT, skip_or_fail
from tests.support.server_process import free_port, start_command

DOCKERFILE = REPO_ROOT / "Dockerfile"
# The CPU wheel on this machine's disk; pinned so that nothing resolves torch to a CUDA build.
TORCH = "torch==2.13.0"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment less what points Python at the checkout or configures SMon
    (the test environment's bin folder leaves PATH too)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "XDG_DATA_HOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("SMON_")}
    ours = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != ours)
    return {**env, **extra}


def run(args: Sequence[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command to completion; a failure quotes its output. Returns stdout."""
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        command = " ".join(map(str, args))
        pytest.fail(f"{command} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


@dataclass(frozen=True)
class Venv:
    path: Path

    def bin(self, name: str) -> str:
        return str(self.path / "bin" / name)

    @property
    def python(self) -> str:
        return self.bin("python")


def make_venv(path: Path, requirements: Sequence[str], wheelhouse: Path) -> Venv:
    """A fresh virtual environment holding `requirements`, installed from `wheelhouse` only. pip
    runs from the test environment (`--python`): the new one needs no pip of its own. Nothing is
    byte-compiled ahead (a third of torch's install time on this machine): Python compiles what
    the tests import."""
    run([sys.executable, "-m", "venv", "--without-pip", path], cwd=path.parent)
    venv = Venv(path)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv.python,
        "install",
        "--quiet",
        "--no-compile",
        "--no-index",
    ]
    run([*pip, "--find-links", wheelhouse, *requirements], cwd=path.parent)
    return venv


@pytest.fixture(scope="session")
def image_recipe() -> recipe.ImageRecipe:
    return recipe.read(DOCKERFILE)


@pytest.fixture(scope="session")
def wheel(image_recipe: recipe.ImageRecipe, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the image's build stage makes, from what git tracks of the paths it copies plus
    the dashboard as `make web` built it (the image's web stage), with build isolation."""
    if not dashboard.is_built():
        skip_or_fail("the dashboard is not built: run `make web` (make test does)")
    git = shutil.which("git")
    if git is None or not (REPO_ROOT / ".git").exists():
        skip_or_fail("not a git checkout: the wheel is built from the files git tracks")
    assert git is not None
    source = tmp_path_factory.mktemp("source")
    tracked = run([git, "ls-files", "-z", "--", *image_recipe.sources], cwd=REPO_ROOT).split("\0")
    for name in filter(None, tracked):
        if (REPO_ROOT / name).is_file():  # not deleted in the work tree
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    for _stage, path in image_recipe.built:
        shutil.copytree(REPO_ROOT / path, source / path)
    out = tmp_path_factory.mktemp("wheels")
    run(
        [sys.executable, "-m", "pip", "wheel", *image_recipe.wheel_options, "--wheel-dir", out, "."],
        cwd=source,
    )
    [built] = out.glob("smon-*.whl")
    return built


@pytest.fixture(scope="session")
def wheelhouse(
    request: pytest.FixtureRequest,
    wheel: Path,
    image_recipe: recipe.ImageRecipe,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """Every dependency of both environments, as pip resolves them from the index now."""
    cache = request.config.cache
    folder = cache.mkdir("smon-wheelhouse") if cache is not None else tmp_path_factory.mktemp("wheelhouse")
    with open(folder / ".lock", "w") as lock:  # pytest-xdist workers share the folder
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _download(folder, wheel, image_recipe)


def _download(folder: Path, wheel: Path, image_recipe: recipe.ImageRecipe) -> Path:
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(folder)]
    # torch's CPU wheel lies on this machine's disk (pip's find-links); from the index alone pip
    # would take a CUDA build of several GB.
    offline = subprocess.run([*pip, "--no-deps", "--no-index", TORCH], env=clean_env(), capture_output=True)
    if offline.returncode != 0:
        skip_or_fail(f"no {TORCH} wheel among pip's find-links (the CPU build kept on disk)")
    run([*pip, f"{wheel}[{image_recipe.extra}]", TORCH], cwd=wheel.parent)
    for copy in folder.glob("smon-*.whl"):
        copy.unlink()  # the wheel under test is installed from its own path
    return folder


@pytest.fixture(scope="session")
def installs(
    request: pytest.FixtureRequest,
    wheel: Path,
    wheelhouse: Path,
    image_recipe: recipe.ImageRecipe,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[Venv]]]:
    """Both environments, installed at once, of those the selected tests use."""
    root = tmp_path_factory.mktemp("venvs")
    wanted = {
        # As the image's final stage: the wheel with its extra.
        "server_venv": [f"{wheel}[{image_recipe.extra}]"],
        # A training job's environment: torch, and the wheel without extras.
        "agent_venv": [TORCH, str(wheel)],
    }
    used = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {
            name: pool.submit(make_venv, root / name, requirements, wheelhouse)
            for name, requirements in wanted.items()
            if name in used
        }


@pytest.fixture(scope="session")
def server_venv(installs: dict[str, Future[Venv]]) -> Venv:
    return installs["server_venv"].result()


@pytest.fixture(scope="session")
def agent_venv(installs: dict[str, Future[Venv]]) -> Venv:
    return installs["agent_venv"].result()


@dataclass(frozen=True)
class InstalledServer:
    http_url: str
    grpc_target: str
    home: Path  # its HOME and working directory, outside the checkout

    def get(self, path: str) -> httpx.Response:
        response = httpx.get(self.http_url + path, timeout=30)
        response.raise_for_status()
        return response


@pytest.fixture(scope="session")
def installed_server(
    server_venv: Venv, image_recipe: recipe.ImageRecipe, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InstalledServer]:
    """The image's entry point from the server environment, on its default database (the
    embedded SQLite file under HOME), started in a home folder outside the checkout."""
    home = tmp_path_factory.mktemp("home")
    assert not home.resolve().is_relative_to(REPO_ROOT)
    http, grpc = free_port(), free_port()
    program, *args = image_recipe.entrypoint
    command = [server_venv.bin(program), *args, "--http-port", str(http), "--grpc-port", str(grpc)]
    env = clean_env(HOME=str(home), SMON_ANALYSIS_INTERVAL="1")
    process = start_command(command, http, env, cwd=home)
    try:
        yield InstalledServer(f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", home)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
