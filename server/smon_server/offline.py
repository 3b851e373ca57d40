"""`smon analyze TRACE [--meta META.yaml] [--json]`: the what-if analysis of a trace, offline.

TRACE is a per-op parquet file (the conformance schema, whatif/inputs/trace.py) or a folder of PyTorch
profiler traces, one per rank (whatif/inputs/kineto.py). `analyze_file` loads, analyses and diagnoses,
and returns the DESIGN §6 summary object (`job_id` is the trace name, `world_size` comes from the
meta file or the traces); `report` renders it for a terminal; `main` is what the CLI calls.
GPU-hours wasted use the world size (else the workers seen) and the traced steps' own duration as
the elapsed time: a trace of sampled steps only knows those.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from smon_server.views.summary import to_summary
from smon_server.whatif.config import Estimator, WhatIfConfig
from smon_server.whatif.diagnosis import Diagnosis, diagnose_with_stragglers
from smon_server.whatif.engine import WhatIfResult, analyze
from smon_server.whatif.inputs.from_steps import build_op_table, complete_steps
from smon_server.whatif.inputs.trace import TraceError, load_meta, load_trace
from smon_server.whatif.layout import AnalysisError
from smon_server.whatif.ops import OpTable
from smon_server.whatif.signals import Signals


def analyze_file(
    trace: str | Path, meta: str | Path | None = None, estimator: Estimator | None = None
) -> tuple[dict[str, Any], WhatIfResult, list[Diagnosis]]:
    """`estimator` "paper" or "robust"; None picks the paper's for a per-op file (reproduces the
    published results) and the live server's robust one for profiler traces, whose few ranks
    would keep much of a straggler inside the paper's mean (docs/analysis.md)."""
    if Path(trace).is_dir():
        return analyze_profile(trace, meta, estimator or "robust")
    estimator = estimator or "paper"
    loaded = load_trace(trace, meta)
    n_workers = len(set(zip(loaded.table.dp_rank.tolist(), loaded.table.stage.tolist(), strict=True)))
    gpus = loaded.meta.world_size if loaded.meta and loaded.meta.world_size else n_workers
    result = analyze(loaded.table, config=WhatIfConfig(estimator=estimator))
    # The elapsed time is known once the steps are measured: the traced steps' own duration.
    hours = float(result.trace_step_time.sum()) / 3600.0
    result = replace(result, gpu_hours_wasted=max(result.waste_fraction, 0.0) * gpus * hours)
    diagnoses, named = diagnose_with_stragglers(loaded.table, result)
    summary = to_summary(
        result,
        diagnoses,
        job_id=loaded.name,
        world_size=loaded.meta.world_size if loaded.meta else None,
        stragglers=named,
        state="finished",  # a trace file is a finished record
    )
    summary["data_quality"]["rows_rejected"] = loaded.rows_rejected
    return summary, result, diagnoses


def analyze_profile(
    directory: str | Path, meta: str | Path | None = None, estimator: Estimator = "robust"
) -> tuple[dict[str, Any], WhatIfResult, list[Diagnosis]]:
    """The same analysis on a folder of profiler traces: each rank's profiled steps become the
    step records an agent would have sent, and go through the live op-table builder."""
    from smon_server.whatif.inputs.kineto import load_profile

    job_meta = load_meta(meta) if meta is not None else None
    profile = load_profile(directory, job_meta)
    cols = complete_steps(profile.columns)
    if not len(cols):
        raise TraceError(f"{directory}: no profiled step is present in every rank's trace")
    table: OpTable = build_op_table(cols)
    # Ranks on different hosts have different clocks: align them on the collectives' shared ends.
    config = WhatIfConfig(estimator=estimator, align_clocks=profile.several_hosts)
    result = analyze(table, config=config)
    hours = float(result.trace_step_time.sum()) / 3600.0
    result = replace(result, gpu_hours_wasted=max(result.waste_fraction, 0.0) * profile.world_size * hours)
    backend = "nccl" if any(r.nccl for r in profile.ranks) else ""
    signals = Signals(hosts=dict(profile.hosts), backend=backend)
    diagnoses, named = diagnose_with_stragglers(table, result, signals)
    summary = to_summary(
        result,
        diagnoses,
        job_id=profile.name,
        world_size=profile.world_size,
        hosts=profile.hosts,
        stragglers=named,
        state="finished",
    )
    summary["data_quality"]["files_rejected"] = len(profile.files_rejected)
    for problem in profile.files_rejected:
        print(f"smon analyze: skipped {problem}", file=sys.stderr)
    return summary, result, diagnoses


def main(
    trace: str | Path,
    meta: str | Path | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    estimator: Estimator | None = None,
) -> int:
    """Exit status: 0 analysed, 2 the trace or meta file could not be analysed."""
    out = out or sys.stdout
    try:
        summary, result, _ = analyze_file(trace, meta, estimator)
    except (TraceError, AnalysisError) as e:
        print(f"smon analyze: {e}", file=sys.stderr)
        return 2
    if as_json:
        json.dump(summary, out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        from rich.console import Console

        Console(file=out, width=110, highlight=False).print(report(summary, result))
    return 0


def report(summary: dict[str, Any], result: WhatIfResult) -> Any:
    """A rich renderable: headline, attributions, M_W / M_S, diagnoses, data notes."""
    from rich.console import Group
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    from smon_server.views.evidence import sentences

    def ratio(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}"

    s = summary
    flag = "  [bold red](over 5%: window not trusted)[/]" if s["discrepancy_flagged"] else ""
    straggling = "[bold red]straggling[/]" if result.straggling else "[green]not straggling[/]"
    world = f", world size {s['world_size']}" if s["world_size"] else ""
    head = (
        f"[bold]{s['job_id']}[/]: {s['steps_seen']} steps, {len(result.dp_ranks)} DP x "
        f"{len(result.stages)} stages{world}\n"
        f"slowdown S = [bold]{s['slowdown']:.4f}[/] ({straggling}), waste {s['waste_fraction']:.1%}, "
        f"GPU-hours wasted {s['gpu_hours_wasted'] or 0:.3g}\n"
        f"step time: simulated {result.step_time.mean():.4g} s, ideal {result.ideal_step_time:.4g} s, "
        f"recorded {result.trace_step_time.mean():.4g} s; discrepancy {s['simulation_discrepancy']:.4f}{flag}"
    )
    parts: list[Any] = [Panel(head, title="what-if slowdown", expand=False)]

    attribution = s["attribution"]
    if attribution["by_op_type"]:
        table = Table(title="add-back attribution S_X (measured X, everything else ideal)")
        table.add_column("op type")
        table.add_column("S_X", justify="right")
        table.add_column("stage")
        table.add_column("S_X", justify="right")
        table.add_column("worst DP ranks")
        table.add_column("S_X", justify="right")
        types = list(attribution["by_op_type"].items())
        stages = sorted(attribution["by_stage"].items(), key=lambda kv: -(kv[1] or 0))
        ranks = sorted(attribution["by_dp_rank"].items(), key=lambda kv: -(kv[1] or 0))[:10]
        for i in range(max(len(types), len(stages), len(ranks))):
            row: list[str] = []
            for items in (types, stages, ranks):
                row += [items[i][0], ratio(items[i][1])] if i < len(items) else ["", ""]
            table.add_row(*row)
        parts.append(table)
        a = result.attribution
        top = ", ".join(f"dp {d} / stage {st}" for d, st in a.top_workers) if a else ""
        parts.append(
            f"M_W = [bold]{ratio(s['m_w'])}[/] (idealising the top workers by S_w: {top})\n"
            f"M_S = [bold]{ratio(s['m_s'])}[/] (idealising the last stage)"
        )
    else:
        parts.append("S is below the attribution threshold (1.03): nothing to attribute.")

    if s["diagnoses"]:
        table = Table(title="diagnosis", show_lines=True)
        table.add_column("cause", style="bold")
        table.add_column("share", justify="right")
        table.add_column("conf.", justify="right")
        table.add_column("evidence / recommendation", ratio=1)
        for d in s["diagnoses"]:
            evidence = escape(" ".join(sentences(d["cause"], d["evidence"])))
            table.add_row(
                d["cause"],
                f"{d['share']:.0%}",
                f"{d['confidence']:.2f}",
                f"{evidence}\n→ {escape(d['recommendation'])}",
            )
        parts.append(table)
    if s["stragglers"]:
        shown = [
            f"rank {w['rank']} (dp {w['dp_rank']}, stage {w['stage']}) {w['slowdown']:.3f}"
            for w in s["stragglers"][:8]
        ]
        parts.append("stragglers (S_w): " + ", ".join(shown))
    notes = {k: v for k, v in s["data_quality"].items() if v and k != "rows_used"}
    if notes:
        parts.append("data notes: " + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in notes.items()))
    return Group(*parts)
