"""The tests' fork launcher (tests/support/forkrun.py) against torchrun: the ranks see the
environment torchrun gives them, a failing rank stops the job with its status, a timeout leaves
no process behind, and a rank's exit runs its atexit handlers (the agent's last flush)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _pytest.outcomes import Failed

from tests.e2e.processes import forked, run_job_command

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.parallel]

# Set by torchrun for its own machinery, which the fork launcher does not have (its agent's store,
# an error file per rank, NCCL's error handling).
TORCHRUN_ONLY = {
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_TIMER_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "NCCL_ASYNC_ERROR_HANDLING",
}
# Equal under both launchers for the same rank (ports and run ids differ by design).
SAME_VALUE = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
              "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
              "TORCHELASTIC_MAX_RESTARTS", "MASTER_ADDR", "OMP_NUM_THREADS")  # fmt: skip


def script(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def job_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    return {**env, "PYTHONPATH": os.pathsep.join([str(folder), os.getcwd()]), "OUT": str(folder)}


def test_ranks_see_what_torchrun_gives_them(tmp_path: Path) -> None:
    name = script(
        tmp_path,
        "dump_env",
        """
        import json, os
        keys = [k for k in os.environ if k.startswith(("RANK", "LOCAL_", "WORLD_", "GROUP_", "ROLE_",
                "MASTER_", "TORCHELASTIC_", "TORCH_NCCL", "NCCL_", "OMP_NUM"))]
        launcher = os.environ["LAUNCHER"]
        path = os.path.join(os.environ["OUT"], f"{launcher}-{os.environ['RANK']}.json")
        with open(path, "w") as f:
            json.dump({k: os.environ[k] for k in keys}, f)
        """,
    )
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        name,
    ]
    env = job_env(tmp_path)
    for launcher, command in (("torchrun", torchrun), ("forkrun", forked(2, [], module=name))):
        done = run_job_command(command, {**env, "LAUNCHER": launcher}, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        real = json.loads((tmp_path / f"torchrun-{rank}.json").read_text())
        ours = json.loads((tmp_path / f"forkrun-{rank}.json").read_text())
        assert set(real) - TORCHRUN_ONLY <= set(ours), sorted(set(real) - set(ours))
        assert {k: ours[k] for k in SAME_VALUE} == {k: real[k] for k in SAME_VALUE}
        assert ours["TORCHELASTIC_RUN_ID"] and ours["MASTER_PORT"].isdigit()


def test_a_failing_rank_stops_the_job_with_its_status(tmp_path: Path) -> None:
    name = script(
        tmp_path,
        "one_fails",
        """
        import os, time
        if os.environ["RANK"] == "1":
            raise SystemExit(7)
        time.sleep(600)  # stopped by the launcher once rank 1 has failed (else: the timeout)
        """,
    )
    done = run_job_command(forked(2, [], module=name), job_env(tmp_path), timeout=300)
    assert done.returncode == 7
    assert "rank 1" in done.stderr and "exited with code 7" in done.stderr

    aborted = script(tmp_path, "aborts", "import os\nif os.environ['RANK'] == '0':\n    os.abort()\n")
    done = run_job_command(forked(2, [], module=aborted), job_env(tmp_path), timeout=300)
    assert done.returncode == 128 + 6 and "SIGABRT" in done.stderr


def test_a_timeout_kills_every_rank_after_each_wrote_its_stacks(tmp_path: Path) -> None:
    name = script(
        tmp_path,
        "hangs",
        """
        import os, time
        open(os.path.join(os.environ["OUT"], f"pid{os.environ['RANK']}"), "w").write(str(os.getpid()))
        time.sleep(600)
        """,
    )
    with pytest.raises(Failed, match="still running after 20 s") as failed:
        run_job_command(forked(2, [], module=name), job_env(tmp_path), timeout=20)
    # Before the kill, each rank wrote where it stood (forkrun.STACKS_AFTER): the script's line.
    message = str(failed.value)
    assert message.count("most recent call first") >= 2 and "hangs" in message, message
    pids = [int((tmp_path / f"pid{rank}").read_text()) for rank in (0, 1)]
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_rank_exits_through_its_atexit_handlers_and_stdio(tmp_path: Path) -> None:
    name = script(
        tmp_path,
        "at_exit",
        """
        import atexit, os, sys
        out = os.environ["OUT"]
        rank = os.environ["RANK"]
        atexit.register(lambda: open(os.path.join(out, f"atexit{rank}"), "w").write("flushed"))
        print(f"stdout of rank {rank}")
        sys.stderr.write(f"stderr of rank {rank}")  # no newline, no flush: the exit flushes it
        """,
    )
    done = run_job_command(forked(2, [], module=name), job_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(tmp_path / f"atexit{r}").read_text() for r in (0, 1)] == ["flushed", "flushed"]
    assert "stdout of rank 0" in done.stdout and "stdout of rank 1" in done.stdout
    assert "stderr of rank 0" in done.stderr and "stderr of rank 1" in done.stderr
