"""`smon demo`: the server plus a real 4-rank DDP job with one slowed rank, and what SMon found.

The summary printed at the end is fetched from the server's own REST API, so it is exactly what
`GET /api/v1/jobs/{job}/summary` returns.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from smon_server.demo import training_command
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.settings import Settings
from smon_server.views import evidence

console = Console()


def main(
    *,
    settings: Settings,
    ranks: int,
    steps: int,
    slow_rank: int,
    delay: float,
    keep_running: bool,
) -> int:
    settings = settings.model_copy(update={"analysis_interval": min(settings.analysis_interval, 2.0)})
    try:
        server = BackgroundServer(settings).start()
    except Exception as exc:
        console.print(f"[red]could not start the SMon server:[/red] {exc}")
        console.print("Is another server on these ports? Try --http-port / --grpc-port.")
        return 1
    job = f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    dashboard = f"{server.http_url}/jobs/{quote(job, safe='')}"
    console.print(f"[bold]SMon server[/bold] up: dashboard {server.http_url}/, ingest {server.grpc_target}")
    console.print(
        f"Training job [bold]{job}[/bold]: {ranks} ranks (torchrun, gloo, CPU), {steps} steps, "
        f"rank {slow_rank} slowed by {delay * 1000:.0f} ms per forward."
    )
    console.print(f"Watch it live: [bold]{dashboard}[/bold]")
    env = {
        **os.environ,
        "SMON_SERVER": server.grpc_target,
        "SMON_JOB": job,
        "OMP_NUM_THREADS": "1",
    }
    args = ["--steps", str(steps), "--slow-rank", str(slow_rank), "--delay", str(delay)]
    started = time.monotonic()
    process = subprocess.Popen(training_command(ranks, args), env=env)
    try:
        _follow(server, job, process)
        code = process.wait()
        if code != 0:
            console.print(f"[red]training exited with code {code}[/red]")
        assert server.context is not None
        analysis_pass(server.context, time.time())
        summary = _get(server, f"/api/v1/jobs/{job}/summary")
        console.print(f"\nAnalysed {time.monotonic() - started:.0f} s after the job started.")
        render_summary(summary)
        api = f"{server.http_url}/api/v1/jobs/{quote(job, safe='')}"
        console.print(
            f"\nThe same as JSON:\n"
            f"  summary   {api}/summary\n"
            f"  per step  {api}/steps\n"
            f"  history   {api}/trend\n"
            f"  API docs  {server.http_url}/docs"
        )
        # The last line is the job's page: where a newcomer goes next.
        link = f"[bold]{escape(dashboard)}[/bold]"
        if keep_running:
            console.print(f"\nThe server stays up until Ctrl-C. The job's dashboard:\n  {link}")
            while True:
                time.sleep(3600)
        console.print(f"\nThe job's dashboard (`smon server` serves it again):\n  {link}")
    except KeyboardInterrupt:
        console.print("\nstopping")
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=10)
        server.stop()
    return 0


def _get(server: BackgroundServer, path: str) -> Any:
    response = httpx.get(server.http_url + path, timeout=10)
    response.raise_for_status()
    return response.json()


def _follow(server: BackgroundServer, job: str, process: subprocess.Popen[bytes]) -> None:
    """Print the job's progress as the server sees it until training ends."""
    last_printed = -1
    while process.poll() is None:
        time.sleep(2)
        jobs = {j["job_id"]: j for j in _get(server, "/api/v1/jobs")["jobs"]}
        seen = jobs.get(job)
        if seen is None or seen["last_step"] is None or seen["last_step"] == last_printed:
            continue
        last_printed = seen["last_step"]
        slowdown = seen["slowdown"]
        shown = f"{slowdown:.2f}x" if slowdown else "(analysing)"
        console.print(f"  step {last_printed:>4}  slowdown so far {shown}")


def render_summary(summary: dict[str, Any]) -> None:
    s = summary.get("slowdown")
    waste = summary.get("waste_fraction")
    if s is None:
        console.print("[yellow]No complete steps analysed yet.[/yellow]")
        return
    verdict = "[red]straggling[/red]" if s >= 1.1 else "[green]healthy[/green]"
    console.print(
        f"\n[bold]Job {summary['job_id']}[/bold] ({summary['state']}, "
        f"steps {summary.get('from_step')}-{summary.get('to_step')} analysed after "
        f"{summary.get('warmup_steps', 0)} warm-up steps): slowdown [bold]{s:.2f}x[/bold] "
        f"{verdict}, waste {100 * (waste or 0):.0f}% of GPU time, "
        f"{summary['gpu_hours_wasted']:.4f} GPU-hours wasted"
    )
    if summary.get("discrepancy_flagged"):
        console.print(
            f"[yellow]The replay misses the measured steps by more than 5% "
            f"(discrepancy {summary['simulation_discrepancy']:.2f}): treat these numbers with care.[/yellow]"
        )
    if summary["stragglers"]:
        table = Table(title="Stragglers (worst first)")
        for column in ("rank", "host", "dp_rank", "stage", "slowdown", "cause"):
            table.add_column(column)
        for row in summary["stragglers"]:
            table.add_row(
                str(row["rank"]),
                row["host"],
                str(row["dp_rank"]),
                str(row["stage"]),
                f"{row['slowdown']:.2f}x",
                row["cause"] or "",
            )
        console.print(table)
    else:
        console.print("No straggling rank.")
    if summary["diagnoses"]:
        first = summary["diagnoses"][0]
        console.print(
            f"Diagnosis: [bold]{first['cause']}[/bold] (share {100 * first['share']:.0f}%, "
            f"confidence {first['confidence']:.2f})"
        )
        for sentence in evidence.sentences(first["cause"], first["evidence"]):
            console.print(f"  {escape(sentence)}")
        advice = first["recommendation"]
        console.print(f"  What to do: {escape(advice[:1].upper() + advice[1:])}")
