"""Run every rule over one analysis and order the findings worst first."""

from __future__ import annotations

from collections.abc import Callable

from smon_server.whatif.diagnosis.base import CHECKPOINT_IO, HANG, Diagnosis, DiagnosisConfig, Facts
from smon_server.whatif.diagnosis.hang import hang
from smon_server.whatif.diagnosis.phases import checkpoint_io, communication, data_loader, python_gc
from smon_server.whatif.diagnosis.pipeline import sequence_imbalance, stage_imbalance
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
    signals = signals or Signals()
    config = config or DiagnosisConfig()
    found = hang(signals)
    if table is not None and result is not None:
        facts = Facts(table=table, result=result, signals=signals, config=config)
        found += [d for rule in RULES for d in rule(facts) if _material(d, facts.excess, config)]
    # A hang stops everything (share 1): it leads even against a full-share straggler cause.
    return sorted(found, key=lambda d: (-d.share, d.cause != HANG, -d.confidence))


def _material(d: Diagnosis, excess: float, config: DiagnosisConfig) -> bool:
    """A few percent of jitter on a healthy job is not a cause to page anyone about."""
    if d.cause == CHECKPOINT_IO:  # its share is already a fraction of step time
        return d.share >= config.min_excess
    return d.share * excess >= config.min_excess
