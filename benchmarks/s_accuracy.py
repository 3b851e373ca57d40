"""How close is SMon's slowdown S to the truth? Real DDP jobs, each run with and without a straggler.

For each case and rank count, `smon_server.demo.loop_train` runs under torchrun (gloo, CPU) with one
straggler injected, and once more with the same arguments minus the knob (the clean job; all cases
of one rank count share the same arguments, so they share one clean job, shown as its own row).
Every job ships to one real SMon server started in this process (embedded SQLite in a temporary
directory); after a job ends the benchmark waits until its last step is stored, runs an analysis
pass and reads `GET /api/v1/jobs/{job}/summary`.

Truth = the straggling job's per-iteration time over the clean job's, from the training script's
own wall times (`--report`): per iteration the mean over ranks, the first 10 iterations dropped
(warm-up, as the server does). Median-based for a persistent straggler; mean-based for a periodic
or intermittent one (rank-0 evaluation every N steps, a GC pause every N steps, a data loader whose
prefetch runs dry now and then), whose 1-in-N spikes do not move a median. Both ratios are in the
JSON rows. A case whose job needs other arguments (`data_prefetch`: 2 DataLoader workers) gets a
clean job of its own with them. `S_w waiting (max)` is the largest S_w among the ranks that only
wait for the straggler (they should read about 1).

The healthy case runs with real arithmetic (`--device-ms 0`) and no knob, `--repeats` times per rank
count; the truth is 1 by construction, and the row shows S (median, min-max) and how many ranks
were named stragglers in each run.

    .venv/bin/python benchmarks/s_accuracy.py                 # 2, 4, 8 ranks (~12-15 min)
    .venv/bin/python benchmarks/s_accuracy.py --quick         # 2 ranks only (~3 min)
    .venv/bin/python benchmarks/s_accuracy.py --cases slow_forward,eval --ranks 4 --json out.json

Prints figures, never asserts them: the machine is small and shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from smon_server.demo import training_command
from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.settings import Settings

MODULE = "smon_server.demo.loop_train"
WARMUP_ITERATIONS = 10
JOB_TIMEOUT = 600


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    knob: tuple[str, ...]
    statistic: str  # "median" (persistent straggler) or "mean" (periodic, intermittent)
    expected_rank: int
    # Arguments the case's clean job needs too (it then gets a clean job of its own).
    clean_args: tuple[str, ...] = ()


CASES = [
    # "{d}": the simulated device seconds per forward of the run (the injected delay scales with it)
    Case("slow_forward", "slow forward", ("--slow-rank", "1", "--delay", "{d}"), "median", 1),
    Case("slow_data", "slow data loading", ("--slow-data-rank", "1", "--data-delay", "{d}"), "median", 1),
    Case("gc", "GC pauses", ("--gc-rank", "1", "--gc-every", "4"), "mean", 1),
    Case("host", "untimed host work", ("--host-rank", "1", "--host-delay", "{d}"), "median", 1),
    Case("eval", "rank-0 periodic eval", ("--eval-every", "10", "--eval-batches", "10"), "mean", 0),
    # "{batch}": rank 1's dataset time per batch, 2.5 of its clean job's iterations: its 2 workers
    # cannot keep up, so it waits a whole batch on some steps and nothing on others (issue 29).
    Case(
        "data_prefetch",
        "slow data, prefetch runs dry",
        ("--slow-data-rank", "1", "--data-delay", "{batch}"),
        "mean",
        1,
        clean_args=("--workers", "2"),
    ),
]
BATCH_IN_CLEAN_STEPS = 2.5
HEALTHY = "healthy"


@dataclass
class JobRun:
    job: str
    ranks: int
    args: list[str]
    seconds: float
    returncode: int
    iteration_times: list[float] = field(default_factory=list)  # per iteration, mean over ranks
    summary: dict[str, Any] | None = None
    error: str | None = None

    def stat(self, statistic: str) -> float | None:
        kept = self.iteration_times[WARMUP_ITERATIONS:]
        if not kept:
            return None
        return statistics.median(kept) if statistic == "median" else statistics.fmean(kept)


class Bench:
    def __init__(self, server: BackgroundServer, workdir: Path, steps: int, verbose: bool) -> None:
        self.server = server
        self.workdir = workdir
        self.steps = steps
        self.verbose = verbose
        self.count = 0

    def run(self, name: str, ranks: int, args: list[str]) -> JobRun:
        self.count += 1
        job = f"{name}-{ranks}r-{self.count}-{time.time_ns() % 10**9}"
        report = self.workdir / job
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "SMON_DEMO_QUIET": "1",
            "SMON_SERVER": self.server.grpc_target,
            "SMON_JOB": job,
        }
        full_args = ["--steps", str(self.steps), "--report", str(report), *args]
        started = time.monotonic()
        try:
            done = subprocess.run(
                training_command(ranks, full_args, module=MODULE),
                env=env,
                capture_output=True,
                text=True,
                timeout=JOB_TIMEOUT,
                check=False,
            )
            returncode, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            returncode, stderr = -1, f"timed out after {JOB_TIMEOUT} s"
        run = JobRun(job, ranks, args, time.monotonic() - started, returncode)
        if returncode != 0:
            run.error = f"exit {returncode}: {stderr.strip()[-600:]}"
        else:
            try:
                run.iteration_times = iteration_times(report, ranks)
                run.summary = self.summary(job)
            except Exception as exc:  # the engine is a moving target: report it, carry on
                run.error = f"{type(exc).__name__}: {exc}"
        status = "ok" if run.error is None else f"FAILED ({run.error.splitlines()[-1][:200]})"
        print(f"  {job}: {run.seconds:.0f} s, {status}", file=sys.stderr, flush=True)
        if self.verbose and stderr:
            print(stderr[-2000:], file=sys.stderr)
        return run

    def summary(self, job: str) -> dict[str, Any]:
        """Wait until the job's last step is stored, run an analysis pass, read the summary."""
        url = self.server.http_url
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = {j["job_id"]: j for j in httpx.get(f"{url}/api/v1/jobs", timeout=30).json()["jobs"]}
            if jobs.get(job, {}).get("last_step") == self.steps - 1:
                break
            time.sleep(0.2)
        assert self.server.context is not None
        analysis_pass(self.server.context, time.time())
        response = httpx.get(f"{url}/api/v1/jobs/{job}/summary", timeout=60)
        response.raise_for_status()
        summary = dict(response.json())
        grid = httpx.get(f"{url}/api/v1/jobs/{job}/workers", timeout=60)
        grid.raise_for_status()
        summary["_workers"] = grid.json()
        return summary


def iteration_times(report: Path, ranks: int) -> list[float]:
    per_rank = [json.loads((report / f"rank{r}.json").read_text())["step_times"] for r in range(ranks)]
    return [statistics.fmean(times) for times in zip(*per_rank, strict=False)]


# --- rows -------------------------------------------------------------------------------------


def summary_fields(summary: dict[str, Any] | None) -> dict[str, Any]:
    if summary is None:
        return {}
    diagnoses = summary.get("diagnoses") or []
    lead = diagnoses[0] if diagnoses else None
    return {
        "s": summary.get("slowdown"),
        "estimator": summary.get("estimator"),
        "stragglers": [s["rank"] for s in summary.get("stragglers") or []],
        "straggler_causes": [s.get("cause") for s in summary.get("stragglers") or []],
        "cause": lead["cause"] if lead else None,
        "cause_share": lead.get("share") if lead else None,
        "simulation_discrepancy": summary.get("simulation_discrepancy"),
        "discrepancy_flagged": summary.get("discrepancy_flagged"),
        "steps_seen": summary.get("steps_seen"),
        "m_w": summary.get("m_w"),
        "by_dp_rank": (summary.get("attribution") or {}).get("by_dp_rank"),
        "by_op_type": (summary.get("attribution") or {}).get("by_op_type"),
        "s_w": _s_w_by_dp_rank(summary.get("_workers")),
    }


def _s_w_by_dp_rank(grid: dict[str, Any] | None) -> dict[int, float | None]:
    """S_w of each DP rank (stage 0) from GET /workers."""
    if not grid:
        return {}
    return {int(dp): row[0] for dp, row in zip(grid["dp_ranks"], grid["values"], strict=True) if row}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def case_row(case: Case | None, run: JobRun, clean: JobRun) -> dict[str, Any]:
    """One row: a straggling job against its clean job (case None: the clean job itself)."""
    truth_median = 1.0 if case is None else ratio(run.stat("median"), clean.stat("median"))
    truth_mean = 1.0 if case is None else ratio(run.stat("mean"), clean.stat("mean"))
    statistic = "median" if case is None else case.statistic
    truth = truth_median if statistic == "median" else truth_mean
    row: dict[str, Any] = {
        "case": "clean (baseline)" if case is None else case.name,
        "title": "no straggler" if case is None else case.title,
        "ranks": run.ranks,
        "job": run.job,
        "args": run.args,
        "expected_rank": None if case is None else case.expected_rank,
        "truth_statistic": statistic,
        "truth": truth,
        "truth_median": truth_median,
        "truth_mean": truth_mean,
        "iteration_median_s": run.stat("median"),
        "iteration_mean_s": run.stat("mean"),
        "job_seconds": run.seconds,
        "error": run.error,
        **summary_fields(run.summary),
    }
    if case is not None:
        # The ranks that only wait for the straggler: their S_w should stay near 1.
        others = [v for dp, v in (row.get("s_w") or {}).items() if dp != case.expected_rank and v is not None]
        row["waiting_s_w_max"] = max(others) if others else None
    s = row.get("s")
    row["s_over_truth"] = ratio(s, truth)
    row["error_pct"] = None if row["s_over_truth"] is None else 100 * (row["s_over_truth"] - 1)
    return row


def healthy_row(ranks: int, runs: list[JobRun]) -> dict[str, Any]:
    fields = [summary_fields(r.summary) for r in runs]
    values = [f["s"] for f in fields if f.get("s") is not None]
    s = statistics.median(values) if values else None
    leads = [f.get("cause") for f in fields]
    discrepancies = [f["simulation_discrepancy"] for f in fields if f.get("simulation_discrepancy")]
    return {
        "case": HEALTHY,
        "title": "healthy, real arithmetic",
        "ranks": ranks,
        "jobs": [r.job for r in runs],
        "args": runs[0].args if runs else [],
        "expected_rank": None,
        "truth_statistic": "none",
        "truth": 1.0,
        "s": s,
        "s_min": min(values) if values else None,
        "s_max": max(values) if values else None,
        "s_runs": [f.get("s") for f in fields],
        "s_over_truth": s,
        "error_pct": None if s is None else 100 * (s - 1),
        "estimator": next((f["estimator"] for f in fields if f.get("estimator")), None),
        "stragglers_per_run": [f.get("stragglers") for f in fields],
        "stragglers": sorted({rank for f in fields for rank in f.get("stragglers") or []}),
        "cause": next((c for c in leads if c), None),
        "causes_per_run": leads,
        "simulation_discrepancy": statistics.median(discrepancies) if discrepancies else None,
        "iteration_median_s": statistics.median([r.stat("median") or 0.0 for r in runs]) if runs else None,
        "job_seconds": sum(r.seconds for r in runs),
        "error": "; ".join(r.error for r in runs if r.error) or None,
    }


# --- output -----------------------------------------------------------------------------------


def fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    return format(value, spec)


COLUMNS = [
    "case",
    "ranks",
    "truth",
    "S",
    "S/truth",
    "error %",
    "estimator",
    "stragglers named",
    "S_w waiting (max)",
    "leading cause",
    "sim. discrepancy",
]


def cells(row: dict[str, Any]) -> list[str]:
    truth = fmt(row["truth"])
    if row["truth_statistic"] == "mean":
        truth += f" (mean; median {fmt(row.get('truth_median'))})"
    elif row["truth_statistic"] == "median" and row["case"] != "clean (baseline)":
        truth += f" (mean {fmt(row.get('truth_mean'))})"
    s = fmt(row.get("s"), ".3f")
    if row["case"] == HEALTHY:
        s += f" [{fmt(row.get('s_min'), '.3f')}-{fmt(row.get('s_max'), '.3f')}]"
        named = "counts " + ",".join(str(len(r or [])) for r in row.get("stragglers_per_run") or [])
        if row.get("stragglers"):
            named += f" (ranks {','.join(map(str, row['stragglers']))})"
    else:
        named = ",".join(map(str, row.get("stragglers") or [])) or "none"
        if row.get("expected_rank") is not None:
            named += f" (expect {row['expected_rank']})"
    cause = row.get("cause") or "-"
    if row.get("cause_share") is not None:
        cause += f" {100 * row['cause_share']:.0f}%"
    if row.get("error"):
        cause = "ERROR: " + row["error"].splitlines()[-1][:60]
    return [
        row["case"],
        str(row["ranks"]),
        truth,
        s,
        fmt(row.get("s_over_truth"), ".3f"),
        fmt(row.get("error_pct"), "+.1f"),
        row.get("estimator") or "-",
        named,
        fmt(row.get("waiting_s_w_max"), ".3f"),
        cause,
        fmt(row.get("simulation_discrepancy"), ".3f"),
    ]


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(c), *(len(cells(r)[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        print(title)
        print("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)))
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(cells(row), widths, strict=True)))
        return
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*cells(row))
    Console(width=200).print(table)


# --- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    names = [c.name for c in CASES] + [HEALTHY]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 ranks only")
    p.add_argument("--ranks", help="comma-separated rank counts (default 2,4,8; healthy: 2,4)")
    p.add_argument("--cases", help=f"comma-separated subset of {','.join(names)}")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per job")
    p.add_argument("--device-ms", type=float, default=30.0, help="simulated device ms per forward")
    p.add_argument("--repeats", type=int, default=3, help="healthy-case runs per rank count")
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument("--verbose", action="store_true", help="print each job's stderr tail")
    args = p.parse_args()
    args.case_names = args.cases.split(",") if args.cases else names
    unknown = set(args.case_names) - set(names)
    if unknown:
        p.error(f"unknown case(s) {sorted(unknown)}; choose from {names}")
    if args.ranks:
        args.rank_counts = [int(r) for r in args.ranks.split(",")]
        args.healthy_ranks = args.rank_counts
    else:
        args.rank_counts = [2] if args.quick else [2, 4, 8]
        args.healthy_ranks = [2] if args.quick else [2, 4]
    return args


def main() -> int:
    args = parse_args()
    cases = [c for c in CASES if c.name in args.case_names]
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="smon-s-accuracy-") as tmp:
        settings = Settings(
            database_url=f"sqlite:///{Path(tmp) / 'smon.db'}",
            http_host="127.0.0.1",
            http_port=0,
            grpc_host="127.0.0.1",
            grpc_port=0,
            analysis_interval=3600,  # analysis passes run when this script says so
        )
        with BackgroundServer(settings) as server:
            bench = Bench(server, Path(tmp), args.steps, args.verbose)
            if cases:
                for ranks in args.rank_counts:
                    # Keep the simulated device time well above the CPU the ranks need: more
                    # ranks than cores would otherwise turn a sleep into free CPU for the others.
                    device_ms = args.device_ms * max(1.0, ranks / 4)
                    base = ["--device-ms", f"{device_ms:g}"]
                    print(f"{ranks} ranks: clean job, then {len(cases)} straggling", file=sys.stderr)
                    cleans: dict[tuple[str, ...], JobRun] = {}
                    for case in cases:
                        if case.clean_args not in cleans:
                            clean = bench.run("clean", ranks, [*base, *case.clean_args])
                            cleans[case.clean_args] = clean
                            rows.append(case_row(None, clean, clean))
                        clean = cleans[case.clean_args]
                        batch = BATCH_IN_CLEAN_STEPS * (clean.stat("mean") or device_ms * 4e-3)
                        knob = [
                            k.replace("{d}", f"{device_ms / 1000:g}").replace("{batch}", f"{batch:.4f}")
                            for k in case.knob
                        ]
                        run = bench.run(case.name, ranks, [*base, *case.clean_args, *knob])
                        rows.append(case_row(case, run, clean))
            if HEALTHY in args.case_names:
                for ranks in args.healthy_ranks:
                    print(f"{ranks} ranks: healthy x{args.repeats}, real arithmetic", file=sys.stderr)
                    runs = [bench.run(HEALTHY, ranks, ["--device-ms", "0"]) for _ in range(args.repeats)]
                    rows.append(healthy_row(ranks, runs))
    elapsed = time.monotonic() - started
    print_table(
        rows,
        f"SMon S vs measured truth ({args.steps} steps/job, device {args.device_ms:g} ms/forward "
        f"(x ranks/4 above 4 ranks), "
        f"{elapsed / 60:.1f} min)",
    )
    print(
        "truth: straggling / clean per-iteration time (median, or mean for periodic cases); "
        "error % = 100 (S/truth - 1); healthy: S median [min-max], stragglers named per run"
    )
    if args.json:
        args.json.write_text(json.dumps({"elapsed_s": elapsed, "rows": rows}, indent=2, default=str))
        print(f"rows written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
