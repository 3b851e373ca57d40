"""One big job end to end (issue 30): N simulated ranks of one job at a fixed step rate, against a
real `smon server` (ingest and analysis in one replica) on a fresh PostgreSQL database.

Each rank is `benchmarks/fleet.py`'s simulated agent (the shipper's flush policy and wire form,
the flush interval and throttle the replica's Acks ask for, reconnects and resends), here all of
one job with the job's world size, stepping together (step k of every rank starts at the same
time, as a synchronous data-parallel job's do). Meanwhile this process polls
`GET /api/v1/jobs/{id}/summary` every `--poll` seconds, as a dashboard would. Reported per size:
- ingest: batches and steps acked a second, send->Ack p50 / p99, refused, dropped and lost steps,
  streams reopened, the flush interval the replica asked for;
- every step stored once: steps the agents sent, rows in step_records, distinct (rank, step);
- freshness: the age of the newest analysed step (`to_step`) when each summary was read, against
  the budget of one analysis interval + 15 s, and how often `computed_at` moved (the pass cadence);
- CPU: cores of the server's main process (ingest, API), its analysis processes, PostgreSQL's
  backends and this load generator;
- with `--straggler-at T`: from the step made T s after the start one rank's forward takes
  `--straggler-forward` s longer and every other rank waits for it in the gradient sync; the
  time from that step's start to the first summary naming the rank among the recent stretch's
  stragglers, and among the window's (the time to flag at this scale), and how many reads before
  it named any straggler.

    .venv/bin/python benchmarks/fleet_job.py [--ranks 4096,8192,16384] [--duration 120]

The replica count is one (one server process); the figures say whether one sufficed. Prints
figures, never asserts them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import fleet as fleet_module  # noqa: E402
from benchmarks.bench_db import fresh_database  # noqa: E402
from benchmarks.fleet import Figures, SimAgent, StepTables, fleet, relayed_fleet  # noqa: E402
from benchmarks.ingest import backends_of, cpu_seconds  # noqa: E402
from smon.config import AgentConfig  # noqa: E402
from smon.v1 import ingest_pb2 as pb  # noqa: E402
from tests.support import factories as f  # noqa: E402
from tests.support.server_process import free_port, start_server  # noqa: E402

FRESHNESS_SLACK = 15.0  # the budget: one analysis interval plus this


class RankAgent(SimAgent):
    """A rank of one job: the job's world size in its coordinates, and its steps timed from the
    job's start (shared by every rank) instead of its own."""

    def __init__(
        self,
        job: str,
        rank: int,
        world: int,
        rate: float,
        tables: StepTables,
        config: AgentConfig,
        onset: tuple[int, StepTables] | None = None,
    ) -> None:
        super().__init__(job, rank, rate, tables, config)
        self.coords = f.coords(job, rank, world, host=f"host-{rank // 8}")
        self.job_origin = 0.0  # set once the fleet's start is known
        # (first step, its steps from then on): the straggler's, or a peer's waiting for it
        self.onset = onset

    def batch(self, now: float, origin: float, upto: int, dropped: int) -> bytes:
        return super().batch(now, self.job_origin or origin, upto, dropped)

    def step_table(self, origin: float, upto: int) -> pb.StepTable:
        if self.onset is None or upto <= self.onset[0]:
            return super().step_table(origin, upto)
        at, after = self.onset
        first, starts = self.sent_steps, self.starts(origin, upto)
        split = max(0, at - first)
        later = after.table(first + split, starts[split:])
        return later if split == 0 else _joined(self.tables.table(first, starts[:split]), later)


_COLUMNS = (
    "step", "start_time", "end_time", "duration", "gc_count", "gc_seconds", "span_count", "span_kind",
    "span_start", "span_duration",
)  # fmt: skip


def _joined(a: pb.StepTable, b: pb.StepTable) -> pb.StepTable:
    """Two tables of consecutive steps as one (the same span kinds, as StepTables makes them)."""
    assert list(a.kinds) == list(b.kinds)
    out = pb.StepTable(records=a.records + b.records, kinds=a.kinds)
    for name in _COLUMNS:
        setattr(out, name, getattr(a, name) + getattr(b, name))
    return out


@dataclass(frozen=True)
class Onset:
    """From `step` on, `rank` computes `forward` seconds longer each step and every other rank
    waits for it in the gradient sync (tests.support.factories.dp_job_steps)."""

    step: int
    rank: int
    forward: float

    def tables(self) -> tuple[StepTables, StepTables]:
        """(the straggler's steps, a peer's), from the onset on."""
        steps = f.dp_job_steps(2, [0], slow_rank=1, slow_forward=self.forward, origin=0.0)
        return StepTables(steps[1]), StepTables(steps[0])


@dataclass
class Polls:
    """What each summary read said: (wall time read, to_step, computed_at as epoch seconds)."""

    reads: list[tuple[float, int | None, float | None]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)  # how long each read took
    # Per read: (wall time, ranks named in the recent stretch's stragglers, in the window's)
    named: list[tuple[float, set[int], set[int]]] = field(default_factory=list)


def read_summary(url: str) -> dict[str, Any] | str:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return type(exc).__name__


def epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def poll(url: str, every: float, stop: float, polls: Polls) -> None:
    """Reads the summary every `every` seconds until `stop` (perf_counter), in a thread so the
    fleet's event loop is not held by the request."""
    while time.perf_counter() < stop:
        began = time.perf_counter()
        body = await asyncio.to_thread(read_summary, url)
        polls.seconds.append(time.perf_counter() - began)
        if isinstance(body, str):
            polls.errors[body] = polls.errors.get(body, 0) + 1
        else:
            polls.reads.append((time.time(), body.get("to_step"), epoch(body.get("computed_at"))))
            recent = {int(x["rank"]) for x in (body.get("recent") or {}).get("stragglers") or []}
            window = {int(x["rank"]) for x in body.get("stragglers") or []}
            polls.named.append((time.time(), recent, window))
        await asyncio.sleep(max(0.0, every - (time.perf_counter() - began)))


async def run_job(
    target: str | list[str], summary_url: str, agents: list[RankAgent], args: argparse.Namespace
) -> tuple[Figures, Polls, float]:
    """The fleet and the poller side by side; returns the job's origin (epoch seconds of step 0)."""
    origin = time.time() + 1.0  # fleet() starts the agents one second from now
    for agent in agents:
        agent.job_origin = origin
    polls = Polls()
    stop = time.perf_counter() + 1.0 + args.warmup + args.duration
    figures, _ = await asyncio.gather(
        fleet(target, list(agents), args.duration, args.warmup, args.per_channel)
        if args.ranks_per_host <= 1
        else relayed_fleet(
            target, list(agents), args.duration, args.warmup, args.ranks_per_host, args.per_channel
        ),
        poll(summary_url, args.poll, stop, polls),
    )
    return figures, polls, origin


def children(pid: int) -> list[int]:
    """The server's analysis processes (SMON_ANALYSIS_WORKERS; every core but one by default)."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def stored_steps(conninfo: str, job: str) -> tuple[int, int]:
    """(rows of the job in step_records, distinct (rank, step) among them)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT (s.rank, s.step)) FROM step_records s "
            "JOIN jobs j ON j.key = s.job_key WHERE j.job_id = %s",
            (job,),
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def pass_seconds(urls: list[str]) -> float:
    """Mean wall seconds of the replicas' analysis passes (smon_analysis_pass_seconds): the part
    of a summary's age between a pass reading the steps and storing what it found."""
    total = count = 0.0
    for url in urls:
        with urllib.request.urlopen(url, timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("smon_analysis_pass_seconds_sum"):
                    total += float(line.split()[-1])
                elif line.startswith("smon_analysis_pass_seconds_count"):
                    count += float(line.split()[-1])
    return total / count if count else float("nan")


def freshness(polls: Polls, origin: float, rate: float, measured_from: float) -> dict[str, Any]:
    """Age of the newest analysed step when each summary was read (from when its last step was
    made by every rank), over the reads after `measured_from` (epoch seconds)."""
    ages = [
        read_at - (origin + (to_step + 1) / rate)
        for read_at, to_step, _ in polls.reads
        if to_step is not None and read_at >= measured_from
    ]
    computed = sorted({c for _, _, c in polls.reads if c is not None})
    cadence = [b - a for a, b in itertools.pairwise(computed)]
    first = next((t - origin for t, s, _ in polls.reads if s is not None), None)
    series = [
        (read_at - origin, read_at - (origin + (to_step + 1) / rate))
        for read_at, to_step, _ in polls.reads
        if to_step is not None and read_at >= measured_from
    ]
    return {
        "series": series,
        "reads": len(ages),
        "age_p50": statistics.median(ages) if ages else float("nan"),
        "age_max": max(ages) if ages else float("nan"),
        "cadence": statistics.median(cadence) if cadence else float("nan"),
        "passes": len(computed),
        "first_summary": first,
        "read_p50": statistics.median(polls.seconds) if polls.seconds else float("nan"),
    }


def one_size(n: int, args: argparse.Namespace, config: AgentConfig) -> dict[str, Any]:
    tables = StepTables()
    onset = straggler(args)
    job = f"fleet-job-{n}"
    with fresh_database("smon_bench_fleet_job") as database_url:
        url = make_url(database_url)
        env = {"SMON_ANALYSIS_INTERVAL": str(args.analysis_interval)}
        env.update(kv.split("=", 1) for kv in args.env)
        log = Path(args.server_log) if args.server_log else None
        # `--replicas` servers on the one database; connections spread over them round-robin
        servers, targets, https = [], [], []
        try:
            for i in range(args.replicas):
                http, grpc_port = free_port(), free_port()
                path = None if log is None else log.with_name(f"{log.name}.{i}") if i else log
                servers.append(start_server(database_url, http, grpc_port, env, log_path=path))
                targets.append(f"127.0.0.1:{grpc_port}")
                https.append(http)
            conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
            summary_url = (
                f"http://127.0.0.1:{https[0]}/api/v1/jobs/{urllib.parse.quote(job, safe='')}/summary"
            )
            agents = make_agents(job, n, args, tables, config, onset)
            database = url.database or ""
            pids = [server.pid for server in servers]
            workers = [w for pid in pids for w in children(pid)]
            before = {
                "server": cpu_seconds(pids),
                "analysis": cpu_seconds(workers),
                "client": time.process_time(),
                "backends": cpu_seconds(backends_of(database)),
            }
            seen = set(backends_of(database))
            started = time.perf_counter()
            figures, polls, origin = asyncio.run(run_job(targets, summary_url, agents, args))
            wall = time.perf_counter() - started
            seen |= set(backends_of(database))
            workers = sorted(set(workers) | {w for pid in pids for w in children(pid)})
            cpu = {
                "server": cpu_seconds(pids) - before["server"],
                "analysis": cpu_seconds(workers) - before["analysis"],
                "client": time.process_time() - before["client"],
                "backends": cpu_seconds(sorted(seen)) - before["backends"],
            }
            rows, distinct = stored_steps(conninfo, job)
            pass_mean = pass_seconds([f"http://127.0.0.1:{h}/metrics" for h in https])
        finally:
            for server in servers:
                server.kill()
                server.wait(10)
    if figures.error_codes:
        print(f"  streams ended by errors (reopened, unacked batches resent): {dict(figures.error_codes)}")
    if polls.errors:
        print(f"  summary reads that failed: {polls.errors}")
    fresh = freshness(polls, origin, args.rate, origin + args.warmup)
    return {
        "flag": time_to_flag(polls, origin, args.rate, onset) if onset is not None else None,
        "ranks": n,
        **figures.acked(args.duration, config.flush_interval),
        "sent": sum(a.sent_steps for a in agents),
        "rows": rows,
        "distinct": distinct,
        **fresh,
        "pass_seconds": pass_mean,
        "budget": args.analysis_interval + FRESHNESS_SLACK,
        "cores_server": cpu["server"] / wall,
        "cores_analysis": cpu["analysis"] / wall,
        "cores_pg": cpu["backends"] / wall,
        "cores_client": cpu["client"] / wall,
        "load": os.getloadavg()[0],
    }


def make_agents(
    job: str, n: int, args: argparse.Namespace, tables: StepTables, config: AgentConfig, onset: Onset | None
) -> list[RankAgent]:
    """One simulated shipper per rank (with `--ranks-per-host` K > 1, fleet.SimRelay bundles each
    host's K ranks on one StreamHost stream, as the agents' host relay does)."""
    if onset is None:
        return [RankAgent(job, rank, n, args.rate, tables, config) for rank in range(n)]
    slow, peer = onset.tables()
    return [
        RankAgent(job, rank, n, args.rate, tables, config, (onset.step, slow if rank == onset.rank else peer))
        for rank in range(n)
    ]


def straggler(args: argparse.Namespace) -> Onset | None:
    if args.straggler_at <= 0:
        return None
    return Onset(round(args.straggler_at * args.rate), args.straggler_rank, args.straggler_forward)


def time_to_flag(polls: Polls, origin: float, rate: float, onset: Onset) -> dict[str, Any]:
    """Seconds from the onset step's start to the first summary read naming the straggler in
    the recent stretch, and in the window's stragglers; reads before the onset naming any rank."""
    at = origin + onset.step / rate
    recent = next((t - at for t, r, _ in polls.named if t >= at and onset.rank in r), None)
    window = next((t - at for t, _, w in polls.named if t >= at and onset.rank in w), None)
    before = [(r, w) for t, r, w in polls.named if t < at]
    false = sum(1 for r, w in before if r or w)
    return {"recent": recent, "window": window, "before": len(before), "false": false}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="4096,8192,16384", help="job sizes, comma-separated")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured per size")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument("--rate", type=float, default=1.0, help="steps a second of every rank")
    parser.add_argument("--analysis-interval", type=float, default=10.0, help="SMON_ANALYSIS_INTERVAL")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between summary reads")
    parser.add_argument("--per-channel", type=int, default=8, help="ranks sharing one connection")
    parser.add_argument("--ranks-per-host", type=int, default=1, help="ranks one shipper carries")
    parser.add_argument("--replicas", type=int, default=1, help="servers on the one database")
    parser.add_argument(
        "--drain", type=float, default=120.0, help="seconds an agent waits for its last Acks after the run"
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    parser.add_argument("--server-log", default="", help="keep the server's output in this file")
    parser.add_argument(
        "--straggler-at",
        type=float,
        default=0.0,
        help="seconds after the job's start when one rank turns slow (0: none); reports the time to flag",
    )
    parser.add_argument("--straggler-rank", type=int, default=1, help="the rank that turns slow")
    parser.add_argument(
        "--straggler-forward",
        type=float,
        default=0.3,
        help="seconds its forward takes longer each step (a step: 1 / rate)",
    )
    args = parser.parse_args()
    fleet_module.DRAIN_SECONDS = args.drain
    config = AgentConfig()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    print(
        f"commit {commit.stdout.strip()}, load {os.getloadavg()}, one job, {args.rate} steps/s a rank, "
        f"{args.duration:.0f} s measured after {args.warmup:.0f} s, analysis interval "
        f"{args.analysis_interval:.0f} s, {args.per_channel} rank(s) a connection, "
        f"{args.ranks_per_host} rank(s) a host stream, {args.replicas} replica(s)"
    )
    print(
        f"{'ranks':>6} {'batch/s':>8} {'steps/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'refused':>7} "
        f"{'dropped':>7} {'lost':>5} {'recon':>5} {'flush s':>7} {'sent':>9} {'stored':>9} {'distinct':>9} "
        f"{'age p50':>7} {'age max':>7} {'budget':>6} {'passes':>6} {'cadence':>7} "
        f"{'srv cores':>9} {'analysis':>8} {'pg cores':>8} {'gen cores':>9} {'load':>5}"
    )
    for n in (int(x) for x in args.ranks.split(",")):
        r = one_size(n, args, config)
        print(
            f"{n:>6} {r['batches_s']:>8,.0f} {r['steps_s']:>8,.0f} {r['p50'] * 1000:>7.0f} "
            f"{r['p99'] * 1000:>7.0f} {r['refused']:>7.0f} {r['dropped']:>7.0f} {r['lost']:>5.0f} "
            f"{r['reconnects']:>5.0f} {r['flush']:>7.2f} {r['sent']:>9,} {r['rows']:>9,} {r['distinct']:>9,} "
            f"{r['age_p50']:>7.1f} {r['age_max']:>7.1f} {r['budget']:>6.0f} {r['passes']:>6} "
            f"{r['cadence']:>7.1f} {r['cores_server']:>9.2f} {r['cores_analysis']:>8.2f} "
            f"{r['cores_pg']:>8.2f} {r['cores_client']:>9.2f} {r['load']:>5.1f}",
            flush=True,
        )
        first = r["first_summary"]
        print(
            f"  every step stored once: {r['rows'] == r['sent'] == r['distinct']}; first summary "
            f"{'never' if first is None else f'{first:.0f} s after the start'}; summary read p50 "
            f"{r['read_p50'] * 1000:.0f} ms; fresh within {r['budget']:.0f} s: "
            f"{bool(r['age_max'] <= r['budget'])} ({r['reads']} reads measured); analysis pass "
            f"{r['pass_seconds']:.1f} s on average",
            flush=True,
        )
        flag = r["flag"]
        if flag is not None:
            named = {k: "never" if flag[k] is None else f"{flag[k]:.1f} s" for k in ("recent", "window")}
            print(
                f"  straggler (rank {args.straggler_rank}, +{args.straggler_forward * 1000:.0f} ms forward "
                f"from {args.straggler_at:.0f} s): named in the recent stretch {named['recent']} after the "
                f"onset, in the window's stragglers {named['window']}; {flag['false']} of the "
                f"{flag['before']} reads before it named a straggler",
                flush=True,
            )
        print(
            "  summary age by read (s after the start: age s): "
            + ", ".join(f"{at:.0f}: {age:.1f}" for at, age in r["series"]),
            flush=True,
        )


if __name__ == "__main__":
    main()
