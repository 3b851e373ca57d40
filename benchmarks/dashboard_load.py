"""How fast does the dashboard draw a 4,096-rank × 500-step heatmap, and how much does it download?
(issue 10)

Stores one 4,096-rank job with an analysis shaped like the live path's (benchmarks/api_latency.py
`populate`, plus a few other jobs) in a fresh PostgreSQL database, starts a real server on it and
opens `/jobs/{id}` in headless Chromium (Debian's package, driven by Playwright), each time in a
fresh browser context (nothing cached). The figure is the time from navigation start to the
page's `smon:heatmap-drawn` mark, which the heatmap sets once its canvas is painted.

Baselines measured in the same run: the heatmap request alone with an HTTP client (what the
server costs), and the same grid at full detail (every rank, no binning) to show what binning to
the canvas saves.

    .venv/bin/python benchmarks/dashboard_load.py [--ranks 4096] [--runs 7]

Prints figures, never asserts them.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.*
from benchmarks.api_latency import populate
from benchmarks.bench_db import fresh_database, loopback_settings
from smon_server import dashboard
from smon_server.runtime import BackgroundServer
from smon_server.store import migrate
from smon_server.store.db import Database

DRAWN = "smon:heatmap-drawn"


def load_once(browser: Any, url: str) -> dict[str, Any]:
    """One cold page load: navigation start → heatmap drawn, and the bytes it fetched."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        page.goto(url)
        page.wait_for_function(f"() => performance.getEntriesByName('{DRAWN}').length > 0", timeout=120_000)
        return dict(
            page.evaluate(
                """(mark) => {
                  const drawn = performance.getEntriesByName(mark)[0].startTime;
                  const res = performance.getEntriesByType('resource');
                  const heat = res.filter((r) => r.name.includes('/heatmap'));
                  const sum = (list, key) => list.reduce((a, r) => a + r[key], 0);
                  return {
                    drawn_ms: drawn,
                    transfer_bytes: sum(res, 'transferSize'),
                    heat_transfer_bytes: sum(heat, 'transferSize'),
                    heat_body_bytes: sum(heat, 'decodedBodySize'),
                    heat_fetch_ms: heat.length ? heat[heat.length - 1].duration : 0,
                    timeline: res.map((r) => [
                      r.name.replace(location.origin, ''), Math.round(r.startTime), Math.round(r.responseEnd),
                    ]),
                  };
                }""",
                DRAWN,
            )
        )
    finally:
        context.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=20, help="other (64-rank) jobs stored beside it")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--timeline", action="store_true", help="print the last load's requests")
    args = ap.parse_args()
    chromium = shutil.which("chromium")
    if not chromium:
        print("needs Debian's chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    if not dashboard.is_built():
        print("the dashboard is not built: run `make web`", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with fresh_database("smon_bench_dash") as url:
        db = Database(url)
        migrate.upgrade(db)
        big = populate(db, args.jobs, args.ranks)
        db.dispose()
        settings = loopback_settings(url)
        with BackgroundServer(settings) as server, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium)
            page_url = f"{server.http_url}/jobs/{quote(big, safe='')}"
            load_once(browser, page_url)  # the server's first request of each kind warms its caches
            loads = [load_once(browser, page_url) for _ in range(args.runs)]
            browser.close()

            # What the page asked for (rows fit the canvas's height), fetched without a browser.
            api = f"{server.http_url}/api/v1/jobs/{quote(big, safe='')}/heatmap"
            shown: dict[str, str | int] = {"max_ranks": 474, "max_steps": 1000, "encoding": "f32"}
            api_ms = []
            for _ in range(args.runs):
                t = time.perf_counter()
                body = httpx.get(api, params=shown, timeout=120).content
                api_ms.append((time.perf_counter() - t) * 1000)
            full = httpx.get(api, params={"max_ranks": 8192, "max_steps": 8192}, timeout=300).content

    if args.timeline:
        for name, start, end in loads[-1]["timeline"]:
            print(f"  {start:6d} -> {end:6d} ms  {name[:100]}")
    drawn = [r["drawn_ms"] for r in loads]
    med = statistics.median(drawn)
    api_med = statistics.median(api_ms)
    print(f"dashboard /jobs/{{id}} of a {args.ranks}-rank x 500-step job, {args.runs} cold loads (Chromium)")
    print(f"  navigation -> heatmap drawn   median {med:7.0f} ms   max {max(drawn):7.0f} ms (target 1 s)")
    print(f"  heatmap request alone (httpx) median {api_med:7.0f} ms   page / request = {med / api_med:.1f}x")
    last = loads[-1]
    print(
        f"  downloaded per load            {last['transfer_bytes'] / 1e6:6.2f} MB in all, heatmap "
        f"{last['heat_transfer_bytes'] / 1e6:.2f} MB on the wire, {last['heat_body_bytes'] / 1e6:.2f} MB body"
    )
    zipped = len(gzip.compress(full, compresslevel=1))
    print(
        f"  full-detail grid (no binning)  {len(full) / 1e6:6.2f} MB JSON, {zipped / 1e6:.2f} MB gzipped "
        f"= {len(full) / max(1, len(body)):.1f}x the binned one"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
