"""torchrun's command line and rank environment, with ranks forked from one process that has
already imported torch: how the tests launch most of their real multi-rank jobs.

    python -m tests.support.forkrun --nproc-per-node 4 -m module args...
    python -m tests.support.forkrun --serve SOCKET   (the warm launcher: tests/support/warm_launcher.py)

Under torchrun, on this 2-core machine, a 4-rank demo job whose steps take 4.3 s took 16-19 s:
torchrun's own process imports torch; each rank imports torch and the agent again (4 at once on
2 cores); DDP's first construction imports torch._dynamo and sympy (~2 s a rank); and each
interpreter's teardown with torch loaded is ~0.9 CPU s. Here the launcher imports all that once
and forks the ranks, which run the script as `__main__` and exit through the interpreter's usual
shutdown (non-daemon threads joined, every atexit handler run: the agent's last flush) without its
module teardown. Each rank gets the environment torchrun gives a single-node job on its first
attempt (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, ...), so SMon's coordinates, job id and attempt come out as under
torchrun. Like torchrun, a rank that fails stops the others and the launcher exits with its
status, naming the rank and its signal. The same job: 12-13 s from a shell, 6 s on the warm
launcher, which has imported torch before the job is asked for.

What this does not reproduce is torchrun itself: elastic restarts and its agent's store. Tests of
those (tests/e2e/test_restarts.py), the demo users run and the framework integrations launch with
torchrun; tests/e2e/test_forkrun.py compares the two launchers' rank environments.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

# Seconds the other ranks get to exit after one fails, before they are killed.
GRACE = 5.0
# Environment variable: seconds after which each rank writes its threads' stacks to its stderr
# (the warm launcher sets it a little under the job's timeout).
STACKS_AFTER = "FORKRUN_STACKS_AFTER"


@dataclass
class Launch:
    ranks: int
    module: str
    args: list[str]


USAGE = "usage: forkrun --nproc-per-node N -m MODULE [args...]"


def parse(argv: list[str]) -> Launch:
    """`--nproc-per-node N -m MODULE` then the script's own arguments: torchrun's shape, so a
    command switches launcher by its first words alone."""
    ranks = next((a.partition("=")[2] for a in argv[:1] if a.startswith("--nproc-per-node=")), None)
    if argv[:1] == ["--nproc-per-node"] and len(argv) > 1:
        ranks, argv = argv[1], argv[1:]
    if ranks is None or not ranks.isdigit() or argv[1:2] != ["-m"] or len(argv) < 3:
        raise SystemExit(f"forkrun: {USAGE}")
    return Launch(int(ranks), argv[2], argv[3:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environment(local_rank: int, world: int, port: int, run_id: str) -> dict[str, str]:
    """What torchrun --standalone sets for a worker of a one-node job on its first attempt."""
    return {
        "RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(local_rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


# A forked rank's exit status, once its script has ended (empty in the launcher).
_rank_status: list[int] = []


@atexit.register  # at import, before torch's: atexit runs handlers last-registered first
def _leave_without_teardown() -> None:
    """A rank's last step: after every other atexit handler (the agent's last flush, torch's),
    flush stdio and leave without tearing down the interpreter's modules, ~0.9 s of CPU a rank
    with torch loaded that nothing in a test observes."""
    if _rank_status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_rank_status[0])


def run_rank(launch: Launch, env: dict[str, str]) -> None:
    """In the forked child: become the rank and run the script; never returns to the launcher.

    The script's end unwinds to the interpreter's top level, which shuts down as at any script's
    end (non-daemon threads joined, atexit handlers run) up to the handler above."""
    for held in _leader_only:
        held.close()
    os.environ.update(env)
    after = os.environ.pop(STACKS_AFTER, None)  # not in the environment the script sees
    if after:
        # A rank still running this long is hung: its threads' stacks go to its stderr, which
        # the client shows when it kills the job, so a hang says where each rank stood.
        faulthandler.dump_traceback_later(float(after), exit=False, file=sys.stderr)
    sys.argv = [launch.module, *launch.args]
    try:
        runpy.run_module(launch.module, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as done:
        status = exit_code(done.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    _rank_status.append(status)
    raise SystemExit(status)


def exit_code(value: object) -> int:
    """The status `sys.exit(value)` gives a process."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return f"killed by signal {number} ({signal.Signals(number).name})"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def wait_all(pids: dict[int, int]) -> int:
    """Wait for every rank; after the first failure, stop the rest. The launcher's exit code."""
    failed = 0
    deadline: float | None = None
    while pids:
        if deadline is None:
            pid, status = os.waitpid(-1, 0)
        else:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if time.monotonic() > deadline:
                    for other in pids:
                        os.kill(other, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(0.05)
                continue
        rank = pids.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            print(f"forkrun: rank {rank} (pid {pid}) {describe(status)}", file=sys.stderr, flush=True)
            failed = code if code > 0 else 128 - code
            for other in pids:
                os.kill(other, signal.SIGTERM)
            deadline = time.monotonic() + GRACE
    return failed


def warm_imports() -> None:
    """What every rank imports anyway, imported once here and inherited by each fork."""
    # torch._dynamo (and sympy) is imported by DDP's first construction: ~2 s of CPU a rank.
    import torch._dynamo
    import torch.distributed  # noqa: F401

    import smon  # noqa: F401


def launch_job(launch: Launch) -> int:
    """Fork the ranks, wait for them: the job's exit status."""
    world = launch.ranks
    port, run_id = free_port(), uuid.uuid4().hex
    sys.stdout.flush()
    sys.stderr.flush()
    pids: dict[int, int] = {}
    for local_rank in range(world):
        pid = os.fork()
        if pid == 0:
            run_rank(launch, rank_environment(local_rank, world, port, run_id))
        pids[pid] = local_rank
    return wait_all(pids)


def main(argv: list[str]) -> int:
    launch = parse(argv)
    warm_imports()
    return launch_job(launch)


# --- The warm launcher: a server that has imported torch once for a whole test session ---

# Sockets a job's leader holds that its ranks must not (the client waits for them to close).
_leader_only: list[socket.socket] = []


def serve(path: str) -> None:
    """Accept job requests on a Unix socket and run each in a forked leader.

    A request is one JSON line {argv, env, cwd} (forkrun's own arguments, the job's whole
    environment and working directory) sent with two file descriptors, the job's stdout and
    stderr. The leader answers its pid (its own session: the client kills the job with killpg),
    runs the job as `main(argv)` would and answers its exit status. The server stays
    single-threaded, so a fork never copies a lock held by another thread."""
    warm_imports()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # leaders are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    while True:
        conn, _ = listener.accept()
        try:
            request, fds = receive(conn)
        except (OSError, ValueError) as error:
            print(f"forkrun: bad request: {error}", file=sys.stderr, flush=True)
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            lead(conn, request, fds)
        conn.close()
        for fd in fds:
            os.close(fd)


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise ValueError("the request ended before its newline")
        data += chunk
    if len(fds) != 2:
        raise ValueError(f"{len(fds)} file descriptors instead of stdout and stderr")
    return json.loads(data), fds


def lead(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the leader forked for one job: take its stdio, environment and directory, run it,
    report; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # to wait for its own ranks
    os.setsid()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    _leader_only.append(conn)
    leader = os.getpid()
    status = 1
    try:
        conn.sendall(f"{leader}\n".encode())
        status = main(request["argv"])
    except SystemExit as done:
        if os.getpid() != leader:
            raise  # a rank's end, on its way to the interpreter's shutdown (run_rank)
        status = exit_code(done.code)
    except BaseException:
        if os.getpid() != leader:
            raise
        traceback.print_exc()
    finally:
        if os.getpid() == leader:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                conn.sendall(f"{status}\n".encode())
            finally:
                os._exit(status)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"] and len(sys.argv) == 3:
        serve(sys.argv[2])
    status = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the launcher's own teardown (torch loaded) is ~0.9 s that nobody needs
