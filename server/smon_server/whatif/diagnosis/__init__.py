"""Diagnosis: from what-if numbers (and optional GPU / heartbeat signals) to named causes.

Each rule looks at one family of causes and returns findings with the cause's share of the
slowdown, a confidence in [0, 1], the evidence (a dict of numbers, always a dict) and a concrete
recommendation. Shares of the straggler causes come from one partition of the excess S - 1
(stage / worker / transient compute / the rest, see attribution.py) and from add-back shares of op
types, so they are comparable; findings are sorted by share, worst first.
"""

from __future__ import annotations

from smon_server.whatif.diagnosis.base import (
    CAUSES,
    CHECKPOINT_IO,
    COMMUNICATION,
    DATA_LOADER,
    GPU_THROTTLING,
    HANG,
    HOST_WORK,
    PYTHON_GC,
    SEQUENCE_IMBALANCE,
    SLOW_WORKER,
    STAGE_IMBALANCE,
    Diagnosis,
    DiagnosisConfig,
)
from smon_server.whatif.diagnosis.run import diagnose, diagnose_with_stragglers, stragglers
from smon_server.whatif.diagnosis.stragglers import Straggler

__all__ = [
    "CAUSES",
    "CHECKPOINT_IO",
    "COMMUNICATION",
    "DATA_LOADER",
    "GPU_THROTTLING",
    "HANG",
    "HOST_WORK",
    "PYTHON_GC",
    "SEQUENCE_IMBALANCE",
    "SLOW_WORKER",
    "STAGE_IMBALANCE",
    "Diagnosis",
    "DiagnosisConfig",
    "Straggler",
    "diagnose",
    "diagnose_with_stragglers",
    "stragglers",
]
