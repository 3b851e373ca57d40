"""One analysis pass over an N-rank × 500-step job stored in PostgreSQL, and what a step record
costs to store (issue 8, items 1 and 2).

Builds a fresh PostgreSQL database (SMON_BENCH_DATABASE_URL, default the test server on
127.0.0.1:5432) per size, writes a synthetic DDP job in the compact layout (six spans a step:
data wait, forward, backward with a GC pause nested in it on some steps, the gradient all-reduce
every rank waits in for the slowest, the optimizer; one rank's forward twice as slow), then runs
the server's own pass (`jobs.analysis.analyze_job`: read the window, build the op table, what-if,
attribution, diagnosis, views) in a fresh process and reports its wall time and peak RSS: once
cold (nothing kept, as after a server start), then again after `--new-steps` more steps were
stored, on the op table the first pass kept (the steady state of a live job: jobs/window_ops.py).

Baselines, measured in the same run:
- the pass's budget, SMON_ANALYSIS_INTERVAL's default (10 s), and 2 GB of memory;
- bytes per stored step record (`pg_total_relation_size` over rows, indexes included) against
  the same records in the layout this replaces (JSONB phases and spans, text job id, coordinates
  per row), copied into a table of that shape in the same database.

    .venv/bin/python benchmarks/analysis_pass.py [--ranks 64 512 4096] [--steps 500]

Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.bench_db
from benchmarks.bench_db import fresh_database
from smon_server.store import codec, migrate
from smon_server.store.db import Database
from tests.support.stored import pack_spans, stored_bytes

# The "before" of every figure: main before the cold-pass work (2026-11-25).
BASELINE = "b59de44"
KINDS = ("data_wait", "forward", "backward", "gc", "grad_sync", "optimizer")
OLD_LAYOUT = """CREATE TABLE old_step_records (
  job_id varchar(256), rank int, step bigint, agent_id varchar(64), dp_rank int, pp_rank int,
  tp_rank int, start_time float8, end_time float8, duration float8, phases jsonb, spans jsonb,
  gc_count int, gc_seconds float8, seq_count int, seq_tokens bigint, seq_sum_sq float8,
  seq_max_len int, microbatch_seq jsonb, received_at float8, PRIMARY KEY (job_id, rank, step))"""


def synthetic_job(
    ranks: int, steps: int, rng: np.random.Generator, origin: float, first: int = 0, job_key: int = 1
) -> list[tuple]:
    """Rows (job_key, step, rank, start, duration, agent_key, gc_count, gc_seconds, spans)."""
    rows = []
    t = origin
    slow = ranks // 3
    for step in range(first, first + steps):
        forward = 0.010 + rng.normal(0, 0.0003, ranks)
        forward[slow] *= 2.0
        data = 0.002 + rng.normal(0, 0.0001, ranks)
        backward = 0.020 + rng.normal(0, 0.0005, ranks)
        gc = (rng.random(ranks) < 0.05) * 0.004
        ready = data + forward + backward + gc
        sync_end = ready.max() + 0.004
        for r in range(ranks):
            spans = [
                (0, 0.0, data[r], -1, 0),
                (1, data[r], forward[r], -1, 0),
                (2, data[r] + forward[r], backward[r] + gc[r], -1, 0),
            ]
            if gc[r]:
                spans.append((3, data[r] + forward[r] + 0.005, gc[r], -1, 0))
            spans.append((4, ready[r], sync_end - ready[r], -1, 0))
            spans.append((5, sync_end + 0.0002, 0.003, -1, 0))
            duration = sync_end + 0.0032
            agent = (job_key - 1) * ranks + r + 1
            packed = pack_spans(spans)
            rows.append((job_key, step, r, t, duration, agent, int(gc[r] > 0), float(gc[r]), packed))
        t += sync_end + 0.0032
    return rows


def old_row(row: tuple, job_id: str) -> tuple:
    """The same record in the layout before migration 0005."""
    _, step, rank, start, duration, agent, gc_count, gc_seconds, blob = row
    spans = codec.unpack_spans(blob)
    listed = [[KINDS[int(s["kind"])], float(s["start"]), float(s["duration"]), -1, 0] for s in spans]
    phases: dict[str, float] = {}
    for s in spans:
        kind = KINDS[int(s["kind"])]
        phases[kind] = phases.get(kind, 0.0) + float(s["duration"])
    phases["other"] = 0.0002
    return (
        job_id,
        rank,
        step,
        f"agent-{agent:032d}",
        rank,
        0,
        0,
        start,
        start + duration,
        duration,
        json.dumps(phases),
        json.dumps(listed),
        gc_count,
        gc_seconds,
        0,
        0,
        0.0,
        0,
        "[]",
        start,
    )


def build(url: str, ranks: int, steps: int) -> tuple[float, float]:
    """Store the job; returns (bytes per record now, bytes per record in the old layout)."""
    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
    rng = np.random.default_rng(ranks)
    origin = time.time() - 3600
    rows = synthetic_job(ranks, steps, rng, origin)
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (job_id, attempt, world_size, dp_size, pp_size, tp_size, first_seen, "
            "last_seen, last_step, last_step_seen, gpu_hours_wasted) "
            "VALUES ('bench', 1, %s, %s, 1, 1, %s, %s, %s, %s, 0)",
            (ranks, ranks, origin, time.time(), steps - 1, time.time()),
        )
        with conn.cursor().copy(
            "COPY agents (agent_id, job_id, attempt, rank, local_rank, host, gpu_uuid, dp_rank, pp_rank, "
            "tp_rank, pid, agent_version, backend, clock_offset, first_seen, last_seen, dropped_records, "
            "errors, final, first_step, hb_phase) FROM STDIN"
        ) as copy:
            for r in range(ranks):
                copy.write_row(
                    (
                        f"agent-{r + 1:032d}",
                        "bench",
                        1,
                        r,
                        r % 8,
                        f"host-{r // 8}",
                        "",
                        r,
                        0,
                        0,
                        1,
                        "",
                        "gloo",
                        0.0,
                        origin,
                        time.time(),
                        0,
                        0,
                        False,
                        0,
                        "",
                    )
                )
        insert_kinds(conn, [1])
        with conn.cursor().copy(
            "COPY step_records (job_key, step, rank, start_time, duration, agent_key, gc_count, gc_seconds, "
            "spans) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute("ANALYZE step_records")
        conn.execute(OLD_LAYOUT)
        sample = rows[: min(len(rows), 200_000)]  # the old layout's size per row, on a sample
        with conn.cursor().copy("COPY old_step_records FROM STDIN") as copy:
            for row in sample:
                copy.write_row(old_row(row, "bench-job-6f1c2a9e"))
        old_bytes = conn.execute("SELECT pg_total_relation_size('old_step_records')").fetchone()[0]  # type: ignore[index]
        conn.execute("DROP TABLE old_step_records")
    db = Database(url)
    with db.session() as session:
        new_bytes = stored_bytes(session)
    db.dispose()
    return float(new_bytes) / len(rows), float(old_bytes) / len(sample)


def insert_kinds(conn: psycopg.Connection[Any], job_keys: Iterable[int]) -> None:
    """KINDS as the jobs' span kind names: one dictionary per job attempt since migration 0010
    (`job_span_kinds`); a baseline checkout from before it reads the one `span_kinds` table."""
    tables = conn.execute("SELECT to_regclass('job_span_kinds'), to_regclass('span_kinds')").fetchone()
    assert tables is not None
    if tables[0] is not None:
        conn.execute(
            "INSERT INTO job_span_kinds (job_key, code, name) SELECT k, c, n FROM unnest(%s::int[]) AS k,"
            " unnest(%s::int[], %s::text[]) AS kinds(c, n)",
            (list(job_keys), list(range(len(KINDS))), list(KINDS)),
        )
    if tables[1] is not None:
        conn.execute(
            "INSERT INTO span_kinds (code, name) VALUES "
            + ", ".join(f"({i}, '{k}')" for i, k in enumerate(KINDS))
            + " ON CONFLICT DO NOTHING"
        )


COPY_STEPS = (
    "COPY step_records (job_key, step, rank, start_time, duration, agent_key, gc_count, gc_seconds, "
    "spans) FROM STDIN"
)


def append_steps(url: str, ranks: int, first: int, count: int, job_key: int = 1) -> None:
    """`count` more steps of a job, as ingest would have stored them since the last pass."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT max(start_time + duration) FROM step_records WHERE job_key = %s", (job_key,)
        ).fetchone()
        assert row is not None
        rng = np.random.default_rng(first + job_key)
        rows = synthetic_job(ranks, count, rng, float(row[0]), first=first, job_key=job_key)
        with conn.cursor().copy(COPY_STEPS) as copy:
            for r in rows:
                copy.write_row(r)
        conn.execute(
            # step_writes: ingest's count of writes, what tells a pass the job has news
            "UPDATE jobs SET last_step = %s, last_step_seen = %s, step_writes = step_writes + 1 "
            "WHERE key = %s",
            (first + count - 1, time.time(), job_key),
        )


def _peak_bytes() -> int:
    """This process's peak RSS since the last reset (VmHWM; ru_maxrss where it cannot be read)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> bool:
    """Start a new peak RSS measurement (Linux: writing 5 to clear_refs resets VmHWM)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_pass(url: str, ranks: int, steps: int, new_steps: int, cache_mb: int) -> None:
    """In a fresh process: a cold pass (nothing kept), then twice `new_steps` more steps are
    stored and a pass runs on the op table the one before kept (the second is the steady state:
    "next"); prints, for each, seconds and CPU seconds
    of the analysis (this process: the window read's own thread included, PostgreSQL not), of
    storing its phase columns, and the peak RSS."""
    from smon_server.jobs.analysis import analyze_job
    from smon_server.settings import Settings
    from smon_server.store import phase_grids
    from smon_server.store.models import Job

    settings = Settings(database_url=url, analysis_cache_mb=cache_mb)
    db = Database(url)
    figures: dict[str, object] = {}
    for name in ("cold", "first", "next"):
        if name != "cold":  # the first later pass moves the kept table into buffers with room
            append_steps(url, ranks, steps + (new_steps if name == "next" else 0), new_steps)
            figures["peak_reset"] = _reset_peak()
        with db.transaction() as session:
            job = session.get(Job, ("bench", 1))
            assert job is not None
            start, cpu = time.perf_counter(), time.process_time()
            result = analyze_job(session=session, job=job, settings=settings, now=time.time())
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            stored = time.perf_counter()
            if result.get("phase_columns") is not None:
                phase_grids.write(session, job.key, result["phase_columns"])
            session.flush()
        summary = result["summary"]
        figures[name] = {
            "seconds": seconds,
            "cpu": cpu,
            "store": time.perf_counter() - stored,
            "peak_bytes": _peak_bytes(),
            "slowdown": summary.get("slowdown"),
            "steps": summary.get("steps_seen"),
            "stragglers": len(summary.get("stragglers") or []),
        }
    figures["engine"] = engine_seconds(url, ["bench"])
    print(json.dumps(figures))


def reset(url: str, steps: int) -> None:
    """Back to the job(s) as built: the steps a run appended and what its passes stored removed."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DELETE FROM step_records WHERE step >= %s", (steps,))
        conn.execute("UPDATE jobs SET last_step = %s", (steps - 1,))
        for table in ("analysis_results", "job_trend", "phase_columns"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("VACUUM ANALYZE step_records")


def baseline_tree(revision: str, into: Path) -> Path:
    """The server package of `revision` (git archive), for the "before" runs: their PYTHONPATH."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", revision, "server"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "server"


def _run(command: list[str], pythonpath: Path | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"{' '.join(command[2:4])}... failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def build_many(url: str, jobs: int, ranks: int, steps: int) -> None:
    """`jobs` running jobs of `ranks` ranks × `steps` steps (job keys 1..jobs)."""
    db = Database(url)
    migrate.upgrade(db)
    db.dispose()
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    now = time.time()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        insert_kinds(conn, range(1, jobs + 1))
        for j in range(1, jobs + 1):
            origin = now - 600 - j
            conn.execute(
                "INSERT INTO jobs (key, job_id, attempt, world_size, dp_size, pp_size, tp_size, first_seen, "
                "last_seen, last_step, last_step_seen, gpu_hours_wasted) "
                "VALUES (%s, %s, 1, %s, %s, 1, 1, %s, %s, %s, %s, 0)",
                (j, f"bench-{j}", ranks, ranks, origin, now, steps - 1, now),
            )
            with conn.cursor().copy(
                "COPY agents (key, agent_id, job_id, attempt, rank, local_rank, host, gpu_uuid, dp_rank, "
                "pp_rank, tp_rank, pid, agent_version, backend, clock_offset, first_seen, last_seen, "
                "dropped_records, errors, final, first_step, hb_phase) FROM STDIN"
            ) as copy:
                for r in range(ranks):
                    key = (j - 1) * ranks + r + 1
                    copy.write_row(
                        (key, f"agent-{key:032d}", f"bench-{j}", 1, r, r % 8, f"host-{j}-{r // 8}", "", r,
                         0, 0, 1, "", "gloo", 0.0, origin, now, 0, 0, False, 0, "")
                    )  # fmt: skip
            with conn.cursor().copy(COPY_STEPS) as copy:
                for row in synthetic_job(ranks, steps, np.random.default_rng(j), origin, job_key=j):
                    copy.write_row(row)
        conn.execute("ANALYZE")


def run_many(url: str, jobs: int, ranks: int, steps: int, new_steps: int, workers: str) -> None:
    """In a fresh process: the server's analysis pass over every job (cold), then again after each
    job stored `new_steps` more steps, until two passes in a row leave the workers as they were
    (no spare taken or given back, no job moved: jobs/worker_shares.py; at most SETTLE_PASSES),
    the second being the steady state ("next"), then once with nothing new (idle); prints each
    pass's seconds as JSON. `workers`: SMON_ANALYSIS_WORKERS, or "default" (unset)."""
    from smon_server.context import ServerContext
    from smon_server.jobs.loop import analysis_pass
    from smon_server.settings import Settings

    count = None if workers == "default" else int(workers)
    settings = Settings(database_url=url, analysis_workers=count, stall_seconds=10_000)
    context = ServerContext.from_settings(settings)
    context.storage_maintained_at = time.time()  # partitions and retention are not what is timed
    figures: dict[str, Any] = {"settling": []}
    appended = 0

    def one_pass(name: str) -> None:
        nonlocal appended
        if name != "cold" and name != "idle":
            for j in range(1, jobs + 1):
                append_steps(url, ranks, steps + appended, new_steps, job_key=j)
            appended += new_steps
        start, cpu = time.perf_counter(), _pass_cpu(context)
        analysed = analysis_pass(context, time.time())
        shares = getattr(context.workers, "shares", None)  # a baseline tree may have none
        figures[name] = {
            "seconds": time.perf_counter() - start,
            "analysed": analysed,
            "cpu": _pass_cpu(context) - cpu,
            "workers": getattr(shares, "active", None),
        }

    try:
        one_pass("cold")
        one_pass("first")
        quiet = 0  # passes in a row that changed nothing: the second has no moved job's cold pass
        for _ in range(SETTLE_PASSES):
            one_pass("next")
            change = getattr(context.workers, "last_change", None)
            quiet = quiet + 1 if change is None or not (change.grown or change.moved or change.retired) else 0
            if change is None or quiet == 2:
                break
            figures["settling"].append(figures["next"])
        one_pass("idle")
    finally:
        context.close()  # worker processes end: their CPU time is counted below
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    figures["cpu"] = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    figures["engine"] = engine_seconds(url, [f"bench-{j}" for j in range(1, jobs + 1)])
    print(json.dumps(figures))


# Later passes that may pass before the workers settle (a spare taken, jobs moved over a few
# passes so that their cold passes never make one slower than it was).
SETTLE_PASSES = 12


def _pass_cpu(context: Any) -> float:
    """CPU seconds so far of this process and its analysis worker processes (PostgreSQL not):
    what a pass costs the replica, less blurred than its wall time by other work on the machine.
    A worker started during a pass counts from its start."""
    pids = [os.getpid()]
    workers = context.workers
    if workers is not None:
        for pool in workers._pools:
            pids += [p.pid for p in (getattr(pool, "_processes", None) or {}).values()]
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def engine_seconds(url: str, job_ids: list[str]) -> float:
    """The what-if engine's own time (whatif/engine.py `analyze`, one process) on the op tables
    of the jobs' windows as the later pass analysed them: what a pass costs past the engine is
    the pass's per-job work (reads, stored results, hosts, alerts). The tables are built first,
    outside the timing. A baseline tree without these modules reports NaN."""
    try:
        from smon_server.jobs.step_ranges import warmup_ranges, window_steps
        from smon_server.jobs.window_ops import window_ops
        from smon_server.settings import Settings
        from smon_server.store import queries
        from smon_server.store.models import Job
        from smon_server.whatif.config import WhatIfConfig
        from smon_server.whatif.engine import analyze
    except ImportError:
        return float("nan")
    settings = Settings(database_url=url)
    db = Database(url)
    tables = []
    with db.session() as session:
        for job_id in job_ids:
            job = session.get(Job, (job_id, 1))
            assert job is not None
            lo, hi = queries.resolve_window(
                session=session,
                job=job,
                window=queries.StepWindow(),
                default_last=window_steps(settings, queries.reporting_ranks(session=session, job=job)),
            )
            skip = warmup_ranges(queries.restart_steps(session=session, job=job), settings.warmup_steps)
            built = window_ops(session=session, job=job, lo=lo, hi=hi, key=None, cache=None, skip=skip)
            if built.ops is not None:
                tables.append(built.ops)
    db.dispose()
    try:  # the pass's own configuration (its float width), where the tree has one
        from smon_server.jobs.analysis import live_config

        config = live_config(settings)
    except ImportError:
        config = WhatIfConfig(estimator=settings.estimator)
    start = time.perf_counter()
    for ops in tables:
        analyze(ops, config=config)
    return time.perf_counter() - start


def many_jobs(
    jobs: int, ranks: int, steps: int, new_steps: int, workers: list[str], before: Path | None
) -> None:
    print(
        f"\n{jobs} jobs × {ranks} ranks × {steps} steps, the server's whole analysis pass "
        f"(interval: 10 s); then each job stores {new_steps} more steps and the next pass runs (1st: "
        "the first after a cold pass), again until a pass leaves the analysis workers as they were "
        "(settle: the default takes a spare worker while passes near the interval and moves jobs "
        "to it over a few passes; steady: the first pass that changed nothing). "
        "CPU: every pass, server and worker processes."
    )
    print(
        "engine s: the what-if engine alone (whatif/engine.py) on the same jobs' window op tables, "
        "one process; idle: a pass right after, no job has new steps; CPU: CPU seconds of the pass "
        "in the server and its analysis workers (PostgreSQL not)."
    )
    print(
        f"{'workers':>8} {'pass':>5} {'jobs':>5} {'before s':>9} {'after s':>8} {'/10 s':>6} "
        f"{'after/before':>12} {'engine s':>8} {'/engine':>7} {'CPU before':>10} {'CPU after':>9}"
    )
    with fresh_database("smon_bench_many") as url:
        build_many(url, jobs, ranks, steps)
        for count in workers:
            command = [sys.executable, __file__, "--many-only", url, str(jobs), str(ranks), str(steps)]
            command += [str(new_steps), str(count)]
            runs: dict[str, dict] = {}
            for label, path in (("before", before), ("after", None)):
                if label == "before" and before is None:
                    continue
                runs[label] = _run(command, path)
                reset(url, steps)  # the next run starts from the same stored steps
            after, old = runs["after"], runs.get("before")
            engine = after["engine"]
            for i, one in enumerate(after.get("settling", [])):
                print(
                    f"{count if i == 0 else '':>8} {'settle':>6} {one['analysed']:>5} {'':>9} "
                    f"{one['seconds']:>8.2f} {one['seconds'] / 10:>6.2f} {'':>12} {'':>16} {'':>10} "
                    f"{one.get('cpu', math.nan):>9.2f}  workers {one.get('workers')}",
                    flush=True,
                )
            labels = (("cold", "cold"), ("first", "1st"), ("next", "steady"), ("idle", "idle"))
            for name, label in labels:
                one = after[name]
                was = old[name]["seconds"] if old and name in old else float("nan")
                versus = f"{engine:>8.2f} {one['seconds'] / engine:>7.2f}" if name == "next" else " " * 16
                cpu_was = old[name].get("cpu", math.nan) if old and name in old else math.nan
                print(
                    f"{count if name == 'cold' else '':>8} {label:>6} {one['analysed']:>5} {was:>9.2f} "
                    f"{one['seconds']:>8.2f} {one['seconds'] / 10:>6.2f} {one['seconds'] / was:>12.2f} "
                    f"{versus} {cpu_was:>10.2f} {one.get('cpu', math.nan):>9.2f}  "
                    f"workers {one.get('workers')}",
                    flush=True,
                )
            cpu_before = old["cpu"] if old else float("nan")
            print(f"{'':>8} CPU s, every pass: before {cpu_before:.1f}, after {after['cpu']:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--ranks", type=int, nargs="*", default=[64, 512, 4096], help="single-job sizes (none: skip them)"
    )
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument(
        "--new-steps", type=int, default=10, help="steps stored between the two passes (default 10)"
    )
    parser.add_argument("--cache-mb", type=int, default=4096, help="SMON_ANALYSIS_CACHE_MB for the passes")
    parser.add_argument("--jobs", type=int, default=50, help="jobs of the many-jobs pass (0: skip it)")
    parser.add_argument("--job-ranks", type=int, default=64, help="ranks of each of those jobs")
    parser.add_argument(
        "--workers",
        nargs="+",
        default=["0", "default"],
        help="SMON_ANALYSIS_WORKERS for the many-jobs pass ('default': unset, one worker a core but one "
        "and the spare while passes near the interval)",
    )
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        help=f"git revision whose server runs the same passes as 'before' (default {BASELINE}: main "
        "before the cold-pass work); 'none' to skip",
    )
    parser.add_argument(
        "--baseline-path",
        type=Path,
        help="an extracted server/ tree to run as 'before' instead of --baseline",
    )
    parser.add_argument("--pass-only", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--many-only", nargs=6, metavar="ARG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pass_only:
        url, ranks, steps, new_steps, cache_mb = args.pass_only
        run_pass(url, int(ranks), int(steps), int(new_steps), int(cache_mb))
        return
    if args.many_only:
        url, *numbers = args.many_only
        jobs, ranks, steps, new_steps, workers = numbers
        run_many(url, int(jobs), int(ranks), int(steps), int(new_steps), workers)
        return
    with tempfile.TemporaryDirectory(prefix="smon-baseline-") as tmp:
        before = args.baseline_path
        if before is None and args.baseline != "none":
            before = baseline_tree(args.baseline, Path(tmp))
        load = os.getloadavg()
        print(
            f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
            f"baseline: {args.baseline_path or args.baseline}"
        )
        print(
            f"{'ranks':>6} {'records':>10} {'B/record':>9} {'old B/rec':>9} {'pass':>5} "
            f"{'before s':>9} {'cpu':>6} {'GB':>5} {'after s':>8} {'cpu':>6} {'GB':>5} {'store':>6} "
            f"{'/10 s':>6} {'/2 GB':>6} {'cpu a/b':>7} {'S':>6} {'same S':>6} {'stragglers':>10} "
            f"{'engine s':>8} {'/engine':>7}"
        )
        for ranks in args.ranks:
            with fresh_database("smon_bench_pass") as url:
                per_record, old_per_record = build(url, ranks, args.steps)
                command = [sys.executable, __file__, "--pass-only", url, str(ranks), str(args.steps)]
                command += [str(args.new_steps), str(args.cache_mb)]
                runs: dict[str, dict] = {}
                for label, path in (("before", before), ("after", None)):
                    if label == "before" and before is None:
                        continue
                    try:
                        runs[label] = _run(command, path)
                    except subprocess.CalledProcessError as e:  # e.g. killed: out of memory
                        print(f"{ranks:>6} {label}: the pass process failed ({e.returncode})", flush=True)
                    reset(url, args.steps)
            after, old = runs.get("after"), runs.get("before")
            if after is None:
                continue
            for name, label in (("cold", "cold"), ("first", "1st"), ("next", f"+{args.new_steps}")):
                if name not in after:
                    continue
                one, was = after[name], (old or {}).get(name)
                gb = one["peak_bytes"] / 1e9
                head = (
                    f"{ranks:>6} {ranks * args.steps:>10} {per_record:>9.0f} {old_per_record:>9.0f}"
                    if name == "cold"
                    else " " * 37
                )
                before_cols = (
                    f"{was['seconds']:>9.2f} {was['cpu']:>6.2f} {was['peak_bytes'] / 1e9:>5.2f}"
                    if was
                    else f"{'':>9} {'':>6} {'':>5}"
                )
                same = (
                    ""
                    if not was
                    # the same up to float summation order (one build against chunks: ~1e-10)
                    else (
                        "yes"
                        if math.isclose(was["slowdown"], one["slowdown"], rel_tol=1e-8)
                        else f"{was['slowdown']:.6g}"
                    )
                )
                ratio = f"{one['cpu'] / was['cpu']:>7.2f}" if was else f"{'':>7}"
                engine = after["engine"]
                versus = f"{engine:>8.2f} {one['seconds'] / engine:>7.2f}" if name == "next" else ""
                print(
                    f"{head} {label:>5} {before_cols} {one['seconds']:>8.2f} {one['cpu']:>6.2f} {gb:>5.2f} "
                    f"{one['store']:>6.2f} {one['seconds'] / 10:>6.2f} {gb / 2:>6.2f} {ratio} "
                    f"{one['slowdown']:>6.3f} {same:>6} {one['stragglers']:>10} {versus}",
                    flush=True,
                )
            if not after["peak_reset"]:
                print("(peak RSS could not be reset: the second pass's peak includes the first's)")
        if args.jobs:
            many_jobs(args.jobs, args.job_ranks, args.steps, args.new_steps, args.workers, before)
        load = os.getloadavg()
        print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
