"""Alert rules: defaults in code, overridable by a YAML file (`SMON_ALERT_RULES`).

Each rule has a `for` (how long its condition must hold before it fires; until then the incident
is pending and pages nobody) and a `keep_firing_for` (how long it keeps firing after the condition
clears, so a job that dips under the line for one analysis does not resolve and page again), in
the spirit of Prometheus alerting rules.

    # SMON_ALERT_RULES=/etc/smon/rules.yml
    rules:
      - name: job_straggling
        for: 120
        threshold: 1.15
      - name: worker_straggling
        enabled: false
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str  # warning or critical
    for_seconds: float
    keep_firing_for: float
    threshold: float | None = None  # job_straggling: S at or above it
    critical_threshold: float | None = None  # job_straggling: escalates to critical at this S
    enabled: bool = True


DEFAULT_RULES: tuple[Rule, ...] = (
    # S of the newest steps (or of the window when that is all there is) at or above 1.1; critical
    # from 1.3. One incident per job however many ranks straggle. `for` 30 s: three passes at the
    # default interval, so a page goes out within a minute of an onset (benchmarks/time_to_flag).
    Rule("job_straggling", "warning", 30.0, 120.0, threshold=1.1, critical_threshold=1.3),
    # A worker named a straggler in the window, per host: drain / inspect that node.
    Rule("worker_straggling", "warning", 120.0, 120.0),
    # Alive (heartbeats) but no step completes.
    Rule("job_stalled", "critical", 0.0, 0.0),
    # Some ranks stopped reporting (no batch, not even a heartbeat, for SMON_STALL_SECONDS) while
    # the others go on: a dead agent or node, and the analysis of the job has gaps.
    Rule("ranks_not_reporting", "warning", 0.0, 60.0),
    # A straggler whose GPU reports throttling (clocks, thermal / power slowdown): per host.
    Rule("gpu_unhealthy", "critical", 0.0, 120.0),
    # A GPU reported an XID error or new uncorrectable ECC errors in the last `threshold` seconds:
    # per host, whether or not it straggles yet (a failing GPU often hangs or crashes the job next).
    Rule("gpu_fault", "critical", 0.0, 300.0, threshold=600.0),
    # The job's agents dropped records (send queue full) within the last `threshold` seconds: the
    # server is unreachable or too slow, and the analysis has gaps.
    Rule("agents_dropping_records", "warning", 0.0, 300.0, threshold=600.0),
    # A host whose own ranks straggled in SMON_HOST_SUSPECT_JOBS distinct jobs within
    # SMON_HOST_SUSPECT_DAYS days (hosts/fleet.py): one incident per host, not per job. It
    # resolves once the host has been clean (no new straggler incident) for `threshold` seconds,
    # or is no longer suspect (docs/hosts.md).
    Rule("host_suspect", "warning", 0.0, 0.0, threshold=86_400.0),
)

_KEYS = {"severity", "for", "keep_firing_for", "threshold", "critical_threshold", "enabled"}


class RulesError(ValueError):
    pass


def load_rules(path: str | None) -> tuple[Rule, ...]:
    """The defaults, with the overrides of the YAML file at `path` applied by rule name."""
    if not path:
        return DEFAULT_RULES
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RulesError(f"cannot read alert rules {path}: {e}") from e
    by_name = {r.name: r for r in DEFAULT_RULES}
    for entry in document.get("rules") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in by_name:
            raise RulesError(f"{path}: unknown rule {name!r}; rules are {sorted(by_name)}")
        unknown = set(entry) - _KEYS - {"name"}
        if unknown:
            raise RulesError(f"{path}: rule {name}: unknown keys {sorted(unknown)}")
        changes = {
            "severity": entry.get("severity"),
            "for_seconds": entry.get("for"),
            "keep_firing_for": entry.get("keep_firing_for"),
            "threshold": entry.get("threshold"),
            "critical_threshold": entry.get("critical_threshold"),
            "enabled": entry.get("enabled"),
        }
        by_name[name] = replace(by_name[name], **{k: v for k, v in changes.items() if v is not None})
    return tuple(by_name.values())
