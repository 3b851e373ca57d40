"""How fast does the API answer with a 4,096-rank job and 1,000 other jobs stored? (issue 8, item 3)

Builds a fresh PostgreSQL database (SMON_BENCH_DATABASE_URL, default the test server on
127.0.0.1:5432), stores 1,000 finished 64-rank jobs and one 4,096-rank job, each with agents and
an analysis result shaped like the live path's (500 steps; the big job's summary names 16
stragglers and S_w for 4,096 ranks), starts a real server on it and times sequential requests.

Baseline, measured in the same run on the same database: the path this replaces, where a job's
analysis was one JSONB `result` (its heatmap as JSON lists) that `/summary` and `/jobs` read whole.
The figures printed are p50 / p99 milliseconds and the ratio to that baseline.

Phase heatmaps (`metric=forward`, `metric=backward`): the big job also gets 500 steps of synthetic
step records (benchmarks/analysis_pass.synthetic_job), turned into stored phase columns by the
analysis pass's own code (store/phase_grids.py; the time that adds to a cold pass is printed).
Their baseline is the path before those columns, timed in-process in the same run: the window's
raw records read and decoded (`read_window`), the grid built, and the body built cell by cell
and validated through the pydantic model, as the route did. The slowdown heatmap's baseline is
that same cell-by-cell body on the stored grid.

    .venv/bin/python benchmarks/api_latency.py [--jobs 1000] [--ranks 4096] [--requests 40]

Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.bench_db
from benchmarks.bench_db import fresh_database, loopback_settings
from smon_server.api.schemas import HeatmapOut
from smon_server.grid import Grid
from smon_server.jobs import phase_heatmap
from smon_server.runtime import BackgroundServer
from smon_server.series import StepSeries
from smon_server.store import grids, migrate, phase_grids, step_series
from smon_server.store.db import Database
from smon_server.store.models import Agent, AnalysisResult, Job
from smon_server.store.queries import StepWindow
from smon_server.store.step_window import read_window
from smon_server.views import heatmap as heatmaps
from tests.support.heatmaps import downsample

STEPS = 500


def views(job_id: str, ranks: int, rng: np.random.Generator, now: float) -> dict[str, Any]:
    """The live path's views of one analysis, with realistic sizes."""
    s_w = 1.0 + 0.02 * rng.random(ranks)
    slow = rng.choice(ranks, size=min(16, ranks), replace=False)
    s_w[slow] += 0.3
    steps = np.arange(1000, 1000 + STEPS)
    straggler = {
        "op_type": "forward-compute",
        "own_s_per_step": 0.41,
        "peers_s_per_step": 0.30,
        "surplus_s_per_step": 0.11,
        "steps": [int(s) for s in steps[::25]],
        "every_n_steps": None,
    }
    summary = {
        "job_id": job_id,
        "state": "finished",
        "world_size": ranks,
        "steps_seen": STEPS,
        "from_step": int(steps[0]),
        "to_step": int(steps[-1]),
        "warmup_steps": 10,
        "estimator": "robust",
        "ideal_step_time": 1.0,
        "noise_floor": 1.01,
        "slowdown": 1.3,
        "waste_fraction": 1 - 1 / 1.3,
        "gpu_hours_wasted": 12.5,
        "simulation_discrepancy": 1.01,
        "discrepancy_flagged": False,
        "m_w": 0.8,
        "m_s": 0.1,
        "attribution": {
            "by_op_type": {"forward-compute": 1.2, "backward-compute": 1.1, "grads-all-reduce": 1.02},
            "by_dp_rank": {str(r): float(v) for r, v in enumerate(s_w)},
            "by_stage": {"0": 1.3},
        },
        "stragglers": [
            {
                "rank": int(r),
                "host": f"node-{r // 8}",
                "dp_rank": int(r),
                "stage": 0,
                "slowdown": float(s_w[r]),
                "cause": "slow_worker",
                "evidence": straggler,
            }
            for r in slow
        ],
        "diagnoses": [
            {
                "cause": "slow_worker",
                "share": 0.8,
                "confidence": 0.9,
                "evidence": {"workers": [int(r) for r in slow]},
                "recommendation": "drain the nodes",
            }
        ],
        "data_quality": {"rows_used": ranks * STEPS * 8},
    }
    n = len(steps)
    series = StepSeries.of(steps, np.full(n, 1.3), np.full(n, 1.0), np.full(n, 1.3))
    workers = {"dp_ranks": list(range(ranks)), "stages": [0], "values": [[float(v)] for v in s_w]}
    heat = (s_w[:, None] + 0.01 * rng.random((ranks, STEPS))).astype(np.float32)
    grid = Grid(np.arange(ranks, dtype=np.int64), steps.astype(np.int64), heat)
    return {
        "state": "finished",
        "computed_at": now,
        "summary": summary,
        "steps": series,
        "workers": workers,
        "rank_overall": {str(r): float(v) for r, v in enumerate(s_w)},
        "grid": grid,
    }


def populate(db: Database, jobs: int, big_ranks: int) -> str:
    rng = np.random.default_rng(0)
    now = time.time()
    big = "big-4096"
    names = [big] + [f"job-{i:04d}" for i in range(jobs)]
    with db.engine.begin() as c:
        c.execute(text("CREATE TABLE old_results (job_id text PRIMARY KEY, result jsonb NOT NULL)"))
        for n, job_id in enumerate(names):
            ranks = big_ranks if job_id == big else 64
            t = now - 3600 - n
            c.execute(
                insert(Job),
                [
                    {
                        "job_id": job_id,
                        "world_size": ranks,
                        "dp_size": ranks,
                        "pp_size": 1,
                        "tp_size": 1,
                        "first_seen": t - 7200,
                        "last_seen": t,
                        "last_step": 1000 + STEPS - 1,
                        "last_step_seen": t,
                        "gpu_hours_wasted": 1.0,
                    }
                ],
            )
            c.execute(
                insert(Agent),
                [
                    {
                        "agent_id": uuid.uuid4().hex,
                        "job_id": job_id,
                        "rank": r,
                        "local_rank": r % 8,
                        "host": f"node-{r // 8}",
                        "gpu_uuid": "",
                        "dp_rank": r,
                        "pp_rank": 0,
                        "tp_rank": 0,
                        "pid": 1,
                        "agent_version": "bench",
                        "backend": "nccl",
                        "clock_offset": 0.0,
                        "first_seen": t - 7200,
                        "last_seen": t,
                        "dropped_records": 0,
                        "errors": 0,
                        "final": True,
                        "hb_phase": "",
                    }
                    for r in range(ranks)
                ],
            )
            v = views(job_id, ranks, rng, now)
            s = v["summary"]
            c.execute(
                insert(AnalysisResult),
                [
                    {
                        "job_id": job_id,
                        "computed_at": now,
                        "state": "finished",
                        "from_step": s["from_step"],
                        "to_step": s["to_step"],
                        "steps_seen": STEPS,
                        "slowdown": s["slowdown"],
                        "waste_fraction": s["waste_fraction"],
                        "window_start": t - 600,
                        "window_end": t,
                        "stragglers": len(s["stragglers"]),
                        "worst_rank": s["stragglers"][0]["rank"],
                        "leading_cause": "slow_worker",
                        "summary": s,
                        "steps": step_series.pack(v["steps"]),
                        "workers": v["workers"],
                        "rank_overall": v["rank_overall"],
                        "heatmap": grids.pack(v["grid"]),
                    }
                ],
            )
            g = v["grid"]
            old = {k: v[k] for k in ("state", "computed_at", "summary", "steps", "workers", "rank_overall")}
            old["steps"] = v["steps"].rows()  # the old blob held them as JSON rows
            old["rank_slowdown"] = {
                "ranks": g.ranks.tolist(),
                "steps": g.steps.tolist(),
                "values": g.values.astype(float).tolist(),
            }
            c.execute(
                text("INSERT INTO old_results VALUES (:j, CAST(:r AS jsonb))"),
                {"j": job_id, "r": json.dumps(old)},
            )
        c.execute(text("ANALYZE"))
    return big


def store_steps(db: Database, url: str, job_id: str, ranks: int) -> tuple[float, float]:
    """The big job's raw step records (500 synthetic DDP steps), then its phase columns as the
    analysis pass makes them; returns (seconds turning the records into columns, seconds
    writing them): what the columns add to a cold pass, which reads the records anyway."""
    import psycopg
    from sqlalchemy.engine import make_url

    from benchmarks.analysis_pass import COPY_STEPS, insert_kinds, synthetic_job

    rows = synthetic_job(ranks, STEPS, np.random.default_rng(ranks), time.time() - 3000)
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        insert_kinds(conn, [1])
        with conn.cursor().copy(COPY_STEPS) as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute("ANALYZE step_records")
    del rows
    collector = phase_grids.Collector()
    build = 0.0
    with db.transaction() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        for a in range(-1, STEPS, 64):  # as a cold pass reads: 64 steps at a time
            records = read_window(session=session, job=job, from_step=a, to_step=a + 63)
            started = time.perf_counter()
            collector.add(records, a)
            build += time.perf_counter() - started
        update = collector.update(0)
        assert update is not None
        started = time.perf_counter()
        phase_grids.write(session, job.key, update)
        write = time.perf_counter() - started
    return build, write


def old_phase_heatmap(db: Database, job_id: str, metric: str) -> bytes:
    """The route before the stored columns: the window's raw records, a body cell by cell."""
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        grid = phase_heatmap._raw_phase_grid(session, job, metric, 0, STEPS - 1, None, None)
    body = downsample(grid, max_ranks=512, max_steps=512)
    return HeatmapOut(job_id=job_id, metric=metric, **body).model_dump_json().encode()


def old_slowdown_body(db: Database, job_id: str) -> bytes:
    """The slowdown heatmap's route before the array-built body (the same stored grid)."""
    with db.session() as session:
        blob = session.get(AnalysisResult, (job_id, 1))
        assert blob is not None
        grid = grids.unpack(blob.heatmap)
    body = downsample(grid, max_ranks=512, max_steps=512)
    return HeatmapOut(job_id=job_id, metric="slowdown", **body).model_dump_json().encode()


def new_heatmap(db: Database, job_id: str, metric: str) -> bytes:
    """The route's work now, in-process (the same as the old path's figure measures)."""
    with db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        if metric == "slowdown":
            blob = session.get(AnalysisResult, (job_id, 1))
            assert blob is not None
            grid = grids.unpack(blob.heatmap)
        else:
            grid = phase_heatmap.phase_heatmap(
                session=session, job=job, metric=metric, window=StepWindow(), default_last=STEPS
            )
    grid = heatmaps.select(grid, from_rank=None, to_rank=None, from_step=None, to_step=None)
    return heatmaps.response_json(grid, job_id=job_id, metric=metric, max_ranks=512, max_steps=512)


def timed(fn: Callable[[], Any], n: int, warm: int = 3) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t))
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--old-runs", type=int, default=3, help="runs of the old phase path (~10 s each)")
    args = ap.parse_args()
    with fresh_database("smon_bench_api") as url:
        db = Database(url)
        migrate.upgrade(db)
        started = time.monotonic()
        big = populate(db, args.jobs, args.ranks)
        print(f"stored {args.jobs + 1} jobs in {time.monotonic() - started:.0f} s", file=sys.stderr)
        heat_bytes = len(grids.pack(views(big, args.ranks, np.random.default_rng(0), 0)["grid"]))
        started = time.monotonic()
        build_s, write_s = store_steps(db, url, big, args.ranks)
        print(
            f"stored {args.ranks} x {STEPS} step records in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )
        with db.session() as session:
            phase_bytes = session.execute(text("SELECT pg_total_relation_size('phase_columns')")).scalar_one()
        # The old phase path, in-process on the same database (seconds a request: few runs).
        old_phase = {
            m: timed(partial(old_phase_heatmap, db, big, m), args.old_runs, warm=1)
            for m in ("forward", "backward")
        }
        old_slowdown = timed(lambda: old_slowdown_body(db, big), max(5, args.requests // 4), warm=1)
        in_process = [
            (f"in-process heatmap?metric={m}", timed(partial(new_heatmap, db, big, m), args.requests), base)
            for m, base in (("slowdown", old_slowdown), ("forward", old_phase["forward"]))
        ]

        rows: list[tuple[str, list[float], list[float] | None]] = []
        # Baselines: the replaced path read the whole JSONB result (and /jobs every job's).
        with db.engine.connect() as c:
            old_one = timed(
                lambda: c.execute(
                    text("SELECT result FROM old_results WHERE job_id = :j"), {"j": big}
                ).scalar_one(),
                max(5, args.requests // 4),
            )
            old_all = timed(lambda: c.execute(text("SELECT result FROM old_results")).all(), 2, warm=1)
            old_size = c.execute(
                text("SELECT pg_column_size(result) FROM old_results WHERE job_id = :j"), {"j": big}
            ).scalar_one()
        db.dispose()

        settings = loopback_settings(url)
        with (
            BackgroundServer(settings, freeze_heap=True) as server,
            httpx.Client(base_url=server.http_url, timeout=120) as h,
        ):

            def get(path: str, **params: Any) -> Callable[[], Any]:
                def call() -> Any:
                    r = h.get(path, params=params)
                    r.raise_for_status()
                    return r.content

                return call

            n = args.requests
            rows.append(("GET /jobs (page of 100)", timed(get("/api/v1/jobs"), n), old_all))
            rows.append(
                (
                    "GET /jobs?straggling=true&limit=1000",
                    timed(get("/api/v1/jobs", straggling=True, limit=1000), n // 2),
                    old_all,
                )
            )
            rows.append(
                (f"GET /summary ({args.ranks} ranks)", timed(get(f"/api/v1/jobs/{big}/summary"), n), old_one)
            )
            rows.append(
                (f"GET /steps ({args.ranks} ranks)", timed(get(f"/api/v1/jobs/{big}/steps"), n), old_one)
            )
            rows.append(
                (f"GET /workers ({args.ranks} ranks)", timed(get(f"/api/v1/jobs/{big}/workers"), n), old_one)
            )
            rows.append(
                (
                    f"GET /heatmap ({args.ranks}x{STEPS} -> 512x500)",
                    timed(get(f"/api/v1/jobs/{big}/heatmap"), n),
                    old_slowdown,
                )
            )
            rows.append(
                (
                    "GET /heatmap zoom 64 ranks",
                    timed(get(f"/api/v1/jobs/{big}/heatmap", from_rank=1000, to_rank=1063), n // 2),
                    old_slowdown,
                )
            )
            for m in ("forward", "backward"):
                rows.append(
                    (
                        f"GET /heatmap?metric={m} ({args.ranks}x{STEPS})",
                        timed(get(f"/api/v1/jobs/{big}/heatmap", metric=m), n),
                        old_phase[m],
                    )
                )
            rows.append(
                (
                    "GET /heatmap?metric=forward zoom 64 ranks",
                    timed(
                        get(f"/api/v1/jobs/{big}/heatmap", metric="forward", from_rank=1000, to_rank=1063), n
                    ),
                    old_phase["forward"],
                )
            )
            rows.append(
                (
                    "GET /heatmap?metric=step_time steps 100-149",
                    timed(
                        get(f"/api/v1/jobs/{big}/heatmap", metric="step_time", from_step=100, to_step=149), n
                    ),
                    None,
                )
            )
            heat_body = len(h.get(f"/api/v1/jobs/{big}/heatmap").content)
            rows.extend(in_process)
            forward_body = len(h.get(f"/api/v1/jobs/{big}/heatmap", params={"metric": "forward"}).content)

    print(
        f"API latency, {args.jobs} jobs x 64 ranks + one {args.ranks}-rank job, "
        f"{STEPS} steps each, PostgreSQL"
    )
    print(f"{'request':44} {'p50 ms':>8} {'p99 ms':>8}   baseline p50 ms (old path)   p50 ratio")
    for label, values, base in rows:
        b = statistics.median(base) if base else None
        ratio = f"{statistics.median(values) / b:.3f}" if b else "-"
        shown = "-" if b is None else f"{b:.1f}"
        print(f"{label:44} {p(values, 0.5):8.1f} {p(values, 0.99):8.1f}   {shown:>27}   {ratio:>9}")
    print(
        f"baselines: one job's whole JSONB result (/summary, /steps, /heatmap read it), "
        f"p50 {statistics.median(old_one):.1f} ms, {old_size / 1e6:.1f} MB stored; "
        f"all results (/jobs read them) "
        f"p50 {statistics.median(old_all):.0f} ms"
    )
    print(
        f"heatmap stored: {heat_bytes / 1e6:.1f} MB float32; "
        f"served downsampled: {heat_body / 1e6:.2f} MB JSON"
    )
    print(
        f"phase heatmap baselines: the old path in-process ({args.old_runs} runs each); slowdown heatmap "
        f"baseline: the cell-by-cell body on the stored grid, in-process"
    )
    print(
        f"phase columns: {phase_bytes / 1e6:.1f} MB stored for the window (all metrics); a cold pass "
        f"spends {build_s:.2f} s making them and {write_s:.2f} s writing them; "
        f"metric=forward served: {forward_body / 1e6:.2f} MB JSON"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
