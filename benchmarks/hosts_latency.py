"""How fast does `GET /api/v1/hosts` answer with 10,000 hosts and 100,000 stored incidents? (issue 32)

Builds a fresh PostgreSQL database (SMON_BENCH_DATABASE_URL, default the test server on
127.0.0.1:5432) holding a week of a 10,000-host fleet: 25,000 jobs of 8 hosts each (200,000
host-job rows), 100,000 straggler incidents (a few hosts take many: Zipf-distributed, so some
become suspect) and 20,000 GPU events, written with the store's own models. Then the analysis
loop's full refresh of the stored per-host figures (hosts/fleet.py) is timed, a real server is
started on the database, and sequential requests are timed: the default list (suspect first),
other sort orders, a deep page, `suspect=true`, one host's page, and the metrics scrape.

Baseline, measured in the same run on the same database: the same list aggregated on the spot
from the rollups (`?since=` a week ago: what every request would cost without the stored
figures). Figures are p50 / p99 milliseconds and the p50 ratio to that baseline.

    .venv/bin/python benchmarks/hosts_latency.py [--hosts 10000] [--incidents 100000] [--requests 200]

Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.bench_db
from benchmarks.bench_db import fresh_database, loopback_settings
from smon_server.hosts import fleet
from smon_server.runtime import BackgroundServer
from smon_server.store import migrate
from smon_server.store.db import Database
from smon_server.store.models import HostGpuEvent, HostIncident, HostJob

DAY = 86_400.0
CAUSES = ["slow_worker", "gpu_throttling", "data_loader", "host_work"]
CHUNK = 20_000


def populate(db: Database, *, hosts: int, incidents: int, now: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    names = [f"gpu-node-{i:05d}" for i in range(hosts)]
    jobs = max(1, hosts * 20 // 8)
    host_jobs: list[dict[str, Any]] = []
    for j in range(jobs):
        start = now - rng.random() * 7 * DAY
        for h in rng.choice(hosts, size=min(8, hosts), replace=False):
            host_jobs.append(
                {
                    "host": names[h],
                    "job_id": f"job-{j:06d}",
                    "attempt": 1,
                    "ranks": 8,
                    "gpus": [f"GPU-{h:05d}-{g}" for g in range(8)],
                    "first_seen": start,
                    "last_seen": start + 3600,
                    "gpu_scanned_until": start + 3600,
                }
            )
    # Zipf: most incidents on a few bad hosts, the rest spread thin.
    who = (rng.zipf(1.3, size=incidents) - 1) % hosts
    rows = []
    for k, h in enumerate(who):
        t = now - rng.random() * 7 * DAY
        rows.append(
            {
                "host": names[h],
                "job_id": f"job-{rng.integers(jobs):06d}",
                "attempt": 1,
                "rank": k,  # unique per (job, attempt, rank)
                "gpu_uuid": f"GPU-{h:05d}-{k % 8}",
                "dp_rank": k % 64,
                "stage": 0,
                "cause": CAUSES[k % len(CAUSES)],
                "slowdown": 1.1 + rng.random(),
                "job_slowdown": 1.2,
                "gpu_hours_lost": rng.random() * 4,
                "evidence": {"op_type": "forward-compute", "surplus_s_per_step": 0.05},
                "first_seen": t - 600,
                "last_seen": t,
                "computed_at": t,
            }
        )
    events = []
    for k in range(incidents // 5):
        h = int(who[k])
        kind = ("xid", "ecc_uncorrected", "throttle")[k % 3]
        events.append(
            {
                "host": names[h],
                "gpu_uuid": f"GPU-{h:05d}-{k % 8}",
                "job_id": f"job-{rng.integers(jobs):06d}",
                "rank": 0,
                "kind": kind,
                "time": now - rng.random() * 7 * DAY,
                "code": 79 if kind == "xid" else None,
                "reason": "hw_thermal" if kind == "throttle" else "",
                "value": 30.0 if kind == "throttle" else 1.0,
                "total": k if kind == "ecc_uncorrected" else None,
            }
        )
    for model, data in ((HostJob, host_jobs), (HostIncident, rows), (HostGpuEvent, events)):
        for i in range(0, len(data), CHUNK):
            with db.transaction() as s:
                s.execute(insert(model), data[i : i + CHUNK])
    with db.transaction() as s:
        s.execute(text("ANALYZE"))
    print(f"stored {len(host_jobs):,} host-job rows, {len(rows):,} incidents, {len(events):,} GPU events")


def timed(fn: Callable[[], Any], n: int, warm: int = 5) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--incidents", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    now = time.time()
    with fresh_database("smon_bench_hosts") as url:
        db = Database(url)
        migrate.upgrade(db)
        populate(db, hosts=args.hosts, incidents=args.incidents, now=now)
        policy = fleet.Policy()
        started = time.perf_counter()
        with db.transaction() as s:
            written = fleet.refresh(s, now=now, policy=policy)
        print(
            f"full refresh of the stored host figures: {written:,} hosts in "
            f"{time.perf_counter() - started:.2f} s"
        )
        with db.session() as s:
            suspect = [
                r
                for r in fleet.figures(s, since=now - 7 * DAY, now=now, policy=policy).values()
                if r["suspect"]
            ]
        print(f"suspect hosts: {len(suspect):,}")
        db.dispose()
        since = datetime.fromtimestamp(now - 7 * DAY, tz=UTC).isoformat()
        worst = max(suspect, key=lambda r: r["straggler_jobs"])["host"] if suspect else "gpu-node-00000"
        with (
            BackgroundServer(loopback_settings(url, analysis_workers=0)) as server,
            httpx.Client(base_url=server.http_url, timeout=60) as client,
        ):

            def get(path: str, **params: Any) -> Callable[[], Any]:
                def call() -> Any:
                    r = client.get(path, params=params)
                    r.raise_for_status()
                    return r

                return call

            baseline = timed(get("/api/v1/hosts", since=since), max(10, args.requests // 10))
            cases = {
                "GET /hosts (default: suspect first, 100)": get("/api/v1/hosts"),
                "GET /hosts?sort=gpu_hours_lost": get("/api/v1/hosts", sort="gpu_hours_lost"),
                "GET /hosts?sort=host&order=asc": get("/api/v1/hosts", sort="host", order="asc"),
                "GET /hosts?offset=9000": get("/api/v1/hosts", offset=9000),
                "GET /hosts?suspect=true": get("/api/v1/hosts", suspect="true"),
                "GET /hosts?limit=1000": get("/api/v1/hosts", limit=1000),
                f"GET /hosts/{worst}": get(f"/api/v1/hosts/{worst}"),
                "GET /metrics": get("/metrics"),
            }
            print(f"{'request':44} {'p50 ms':>8} {'p99 ms':>8} {'p50 vs on-the-spot':>20}")
            base50 = statistics.median(baseline)
            print(
                f"{'GET /hosts?since=<7 days ago> (on the spot)':44} {p(baseline, 50):8.1f} "
                f"{p(baseline, 99):8.1f} {'1.00':>20}"
            )
            for name, fn in cases.items():
                t = timed(fn, args.requests)
                print(f"{name:44} {p(t, 50):8.1f} {p(t, 99):8.1f} {p(t, 50) / base50:20.3f}")


if __name__ == "__main__":
    main()
