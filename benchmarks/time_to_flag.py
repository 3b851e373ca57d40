"""How long after a straggler's onset does SMon name it? (issue 8, item 4)

A real DDP job (`smon_server.demo.loop_train` under torchrun, gloo, CPU) runs healthy, then from
step `--onset` on one rank's forward is slower (a GPU that starts throttling). A real server with
its default settings (analysis every SMON_ANALYSIS_INTERVAL = 10 s, a 500-step window) stores the
steps; the benchmark polls `GET /summary` every half second and records when the rank is first
named in the summary's `recent` stragglers, and, as the baseline measured in the same run, when
the window's own `stragglers` list first names it; and when SMon's `job_straggling` alert fires
(the page). Polls before the onset count false alarms.

    .venv/bin/python benchmarks/time_to_flag.py [--ranks 2] [--onset 300] [--after 60]

Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from smon_server.demo import training_command
from smon_server.runtime import BackgroundServer
from smon_server.settings import Settings


@dataclass
class Poll:
    at: float
    recent: list[int]
    window: list[int]
    paged: bool = False  # SMon's job_straggling alert is firing


def poll(url: str, job: str, stop: threading.Event, out: list[Poll]) -> None:
    with httpx.Client(timeout=30) as h:
        while not stop.is_set():
            at = time.time()
            try:
                r = h.get(f"{url}/api/v1/jobs/{job}/summary")
                if r.status_code == 200:
                    body = r.json()
                    recent = [s["rank"] for s in (body.get("recent") or {}).get("stragglers") or []]
                    alerts = h.get(f"{url}/api/v1/alerts", params={"job": job, "state": "firing"}).json()
                    paged = any(a["rule"] == "job_straggling" for a in alerts["alerts"])
                    out.append(Poll(at, recent, [s["rank"] for s in body.get("stragglers") or []], paged))
            except httpx.HTTPError:
                pass
            stop.wait(0.5)


def first_named(polls: list[Poll], rank: int, since: float, which: str) -> float | None:
    for p in polls:
        if p.at >= since and rank in getattr(p, which):
            return p.at - since
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--onset", type=int, default=300, help="the step the straggler starts at")
    ap.add_argument("--after", type=float, default=60.0, help="seconds to run after the onset")
    ap.add_argument("--device-ms", type=float, default=30.0)
    ap.add_argument("--delay-ms", type=float, default=30.0, help="the straggler's extra forward time")
    args = ap.parse_args()
    rank = args.ranks - 1
    step_s = 4 * args.device_ms / 1000  # forward + backward (2x) of simulated device, and the rest
    steps = args.onset + int(args.after / (step_s + args.delay_ms / 1000))
    with tempfile.TemporaryDirectory(prefix="smon-flag-") as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'smon.db'}",
            http_host="127.0.0.1",
            http_port=0,
            grpc_host="127.0.0.1",
            grpc_port=0,
        )
        job = f"flag-{time.time_ns() % 10**9}"
        report = Path(tmp) / "report"
        polls: list[Poll] = []
        stop = threading.Event()
        with BackgroundServer(settings) as server:
            watcher = threading.Thread(target=poll, args=(server.http_url, job, stop, polls), daemon=True)
            watcher.start()
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "SMON_DEMO_QUIET": "1",
                "SMON_SERVER": server.grpc_target,
                "SMON_JOB": job,
            }
            knobs = [
                "--slow-rank",
                str(rank),
                "--delay",
                f"{args.delay_ms / 1000:g}",
                "--slow-from",
                str(args.onset),
            ]
            command = training_command(
                args.ranks,
                [
                    "--steps",
                    str(steps),
                    "--device-ms",
                    f"{args.device_ms:g}",
                    "--report",
                    str(report),
                    *knobs,
                ],
                module="smon_server.demo.loop_train",
            )
            started = time.time()
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
            ended = time.time()
            time.sleep(settings.analysis_interval + 2)  # one more pass over the job's end
            stop.set()
            watcher.join()
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        onset = json.loads((report / f"rank{rank}.json").read_text())["onset"]
    before = [p for p in polls if p.at < onset]
    false_recent = sum(1 for p in before if p.recent)
    false_window = sum(1 for p in before if p.window)
    t_recent = first_named(polls, rank, onset, "recent")
    t_window = first_named(polls, rank, onset, "window")
    t_page = next((p.at - onset for p in polls if p.at >= onset and p.paged), None)
    false_pages = sum(1 for p in before if p.paged)

    def fmt(t: float | None) -> str:
        return "not named" if t is None else f"{t:.1f} s"

    print(
        f"time to flag: {args.ranks} ranks, {steps} steps ({ended - started:.0f} s), "
        f"onset at step {args.onset} ({onset - started:.0f} s in), "
        f"rank {rank} +{args.delay_ms:g} ms per forward, default settings "
        f"(analysis every {settings.analysis_interval:g} s, window {settings.analysis_window_steps} steps, "
        f"recent {settings.recent_seconds:g} s)"
    )
    print(f"  named in `recent` (this work):            {fmt(t_recent)} after onset")
    print(f"  named in the window's stragglers (before): {fmt(t_window)} after onset")
    print(f"  paged (job_straggling firing, default rules): {fmt(t_page)} after onset")
    if t_recent and t_window:
        print(f"  ratio recent / window: {t_recent / t_window:.2f}")
    print(
        f"  before the onset: {len(before)} polls, a straggler named in `recent` in {false_recent}, "
        f"in the window in {false_window}, paged in {false_pages}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
