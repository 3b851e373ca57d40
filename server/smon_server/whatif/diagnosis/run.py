"""Run every rule over one analysis and order the findings worst first."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from smon_server.whatif.diagnosis.base import CHECKPOINT_IO, HANG, Diagnosis, DiagnosisConfig, Facts
from smon_server.whatif.diagnosis.hang import hang
from smon_server.whatif.diagnosis.host import host_work
from smon_server.whatif.diagnosis.phases import checkpoint_io, communication, data_loader, python_gc
from smon_server.whatif.diagnosis.pipeline import sequence_imbalance, stage_imbalance
from smon_server.whatif.diagnosis.stragglers import Straggler, find_stragglers
from smon_server.whatif.diagnosis.workers import worker_causes
from smon_server.whatif.engine import WhatIfResult
from smon_server.whatif.ops import OpTable
from smon_server.whatif.signals import Signals

Rule = Callable[[Facts], list[Diagnosis]]
RULES: tuple[Rule, ...] = (
    worker_causes,
    stage_imbalance,
    sequence_imbalance,
    python_gc,
    data_loader,
    host_work,
    communication,
    checkpoint_io,
)


def diagnose(
    table: OpTable | None,
    result: WhatIfResult | None,
    signals: Signals | None = None,
    config: DiagnosisConfig | None = None,
) -> list[Diagnosis]:
    """Named causes, worst first (by share, then confidence). Without a result (no complete step
    yet) only the heartbeat signals can say anything: that is the hang rule."""
    return diagnose_with_stragglers(table, result, signals, config)[0]


def diagnose_with_stragglers(
    table: OpTable | None,
    result: WhatIfResult | None,
    signals: Signals | None = None,
    config: DiagnosisConfig | None = None,
    limit: int = 16,
) -> tuple[list[Diagnosis], list[Straggler]]:
    """`diagnose` and `stragglers` from one set of facts: the worker rule finds the same
    stragglers the summary lists, and at 16,384 ranks finding them twice was ~0.1 s a pass."""
    signals = signals or Signals()
    config = config or DiagnosisConfig()
    found = hang(signals)
    named: list[Straggler] = []
    if table is not None and result is not None:
        facts = Facts(table=table, result=result, signals=signals, config=config)
        named = find_stragglers(facts, limit=limit)
        found += [d for rule in RULES for d in rule(facts) if _material(d, result.slowdown - 1.0, config)]
    if result is not None and result.discrepancy_flagged:
        found = [_flagged(d, result.discrepancy) if d.cause != HANG else d for d in found]
    # A hang stops everything (share 1): it leads even against a full-share straggler cause.
    return sorted(found, key=lambda d: (-d.share, d.cause != HANG, -d.confidence)), named


def stragglers(
    table: OpTable | None,
    result: WhatIfResult | None,
    signals: Signals | None = None,
    config: DiagnosisConfig | None = None,
    limit: int = 16,
) -> list[Straggler]:
    """The workers that stand out, each with its own cause and evidence (stragglers.py)."""
    if table is None or result is None:
        return []
    facts = Facts(
        table=table, result=result, signals=signals or Signals(), config=config or DiagnosisConfig()
    )
    return find_stragglers(facts, limit=limit)


def _flagged(d: Diagnosis, discrepancy: float) -> Diagnosis:
    """A window whose replay misses the measured steps by more than 5% is shown, not trusted."""
    note = (
        f"simulation discrepancy {discrepancy:.3f}: the replayed steps differ from the measured ones "
        "by more than 5%, so this finding is less certain"
    )
    return replace(d, confidence=d.confidence * 0.5, evidence={**d.evidence, "analysis_flag": note})


def _material(d: Diagnosis, excess: float, config: DiagnosisConfig) -> bool:
    """A few percent of jitter on a healthy job is not a cause to page anyone about."""
    if d.cause == CHECKPOINT_IO:  # its share is already a fraction of step time
        return d.share >= config.min_excess
    return d.share * excess >= config.min_excess
