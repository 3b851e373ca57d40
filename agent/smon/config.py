"""Agent settings: `attach()` arguments first, then `SMON_*` environment variables, then defaults.

Only the names in DESIGN §4 are contractual (`SMON_SERVER`, `SMON_JOB`, `SMON_TOKEN`,
`SMON_DISABLE`, `SMON_*_RANK`, `SMON_NVML_INTERVAL`); the tuning knobs below exist so tests and
unusual deployments can shorten or lengthen intervals without code changes. They are prefixed
`SMON_AGENT_` because the server reads `SMON_*` settings too (it has its own
`SMON_MAX_BATCH_RECORDS`, for instance) and one environment may configure both.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger("smon")

DEFAULT_SERVER = "127.0.0.1:50051"


@dataclass(frozen=True)
class AgentConfig:
    """Everything the background machinery needs; resolved once at attach time."""

    server: str = DEFAULT_SERVER
    token: str | None = None
    # TLS to the server: SMON_TLS=1 (the system's root certificates) or SMON_TLS_CA=<PEM file>
    # (a private CA's; implies TLS). Without TLS the token travels in clear.
    tls: bool = False
    tls_ca_file: str | None = None
    # Shipping: a batch goes out when `max_batch_records` are queued or `flush_interval` has passed
    # since the last one; with nothing to send, a heartbeat-only batch every `heartbeat_interval`.
    flush_interval: float = 1.0
    heartbeat_interval: float = 2.0
    max_batch_records: int = 256
    queue_size: int = 10_000
    max_unacked_batches: int = 64
    # Message compression on the stream: "none" or "gzip". Off by default: a StepTable is ~140 B
    # a record, so a rank sends a few hundred bytes a second, while inflating gzip costs the
    # server ~1 µs a record, about as much as validating and storing it (docs/agent.md).
    compression: str = "none"
    # Bounded flush at close / process exit.
    flush_timeout: float = 3.0
    # Reconnect backoff: full jitter, exponential from `backoff_base` up to `backoff_cap`.
    # The cap is short: a server restart must not cost an agent that exits soon after its records
    # (full jitter spreads thousands of agents' retries over the interval).
    backoff_base: float = 0.25
    backoff_cap: float = 2.0
    # Clock offset: round trips per estimate and how often to refresh it.
    clock_samples: int = 5
    clock_refresh_interval: float = 300.0
    rpc_timeout: float = 5.0
    # GPU sampler period; 0 disables it.
    nvml_interval: float = 5.0
    # GC pauses at least this long become their own `gc` span (all are counted in gc_seconds).
    gc_span_min_seconds: float = 0.001
    # CUDA events not complete after this long: fall back to host timestamps for that step.
    cuda_resolve_timeout: float = 60.0
    # Device clocks time blocks of steps chosen one in `device_sampling` (a power of two; 1: every
    # step), or None: chosen from the step time (sampling.py). SMON_AGENT_DEVICE_SAMPLING=auto|N.
    device_sampling: int | None = None
    # Ship through the host's relay (smon/relay.py: LOCAL_RANK 0's shipper carries the host's
    # batches on one stream). SMON_AGENT_RELAY=on|off|auto; auto: on where LOCAL_WORLD_SIZE > 1.
    relay: bool = False
    # A rank that cannot reach its relay this long ships directly (SMON_AGENT_RELAY_FALLBACK).
    relay_fallback: float = 5.0


def env_flag(name: str) -> bool:
    """True for 1/true/yes/on (any case)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        logger.warning("smon: ignoring %s=%r (not an integer)", name, raw)
        return None


def env_float(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        logger.warning("smon: ignoring %s=%r (not a number)", name, raw)
        return None


def _pick(arg: float | int | None, env_name: str, default: float | int, *, integer: bool = False) -> float:
    if arg is not None:
        return arg
    value = env_int(env_name) if integer else env_float(env_name)
    return default if value is None else value


def resolve_config(
    *,
    server: str | None = None,
    token: str | None = None,
    flush_interval: float | None = None,
    heartbeat_interval: float | None = None,
    flush_timeout: float | None = None,
    queue_size: int | None = None,
    nvml_interval: float | None = None,
    backoff_base: float | None = None,
    backoff_cap: float | None = None,
    max_batch_records: int | None = None,
    tls: bool | None = None,
    tls_ca_file: str | None = None,
    compression: str | None = None,
    device_sampling: int | str | None = None,
) -> AgentConfig:
    """Build the config from arguments > environment > defaults."""
    d = AgentConfig()
    ca = tls_ca_file or os.environ.get("SMON_TLS_CA", "").strip() or None
    return AgentConfig(
        server=server or os.environ.get("SMON_SERVER", "").strip() or DEFAULT_SERVER,
        token=token or os.environ.get("SMON_TOKEN", "").strip() or None,
        tls=bool(ca) or (tls if tls is not None else env_flag("SMON_TLS")),
        tls_ca_file=ca,
        flush_interval=_pick(flush_interval, "SMON_AGENT_FLUSH_INTERVAL", d.flush_interval),
        heartbeat_interval=_pick(heartbeat_interval, "SMON_AGENT_HEARTBEAT_INTERVAL", d.heartbeat_interval),
        flush_timeout=_pick(flush_timeout, "SMON_AGENT_FLUSH_TIMEOUT", d.flush_timeout),
        queue_size=max(1, int(_pick(queue_size, "SMON_AGENT_QUEUE_SIZE", d.queue_size, integer=True))),
        nvml_interval=_pick(nvml_interval, "SMON_NVML_INTERVAL", d.nvml_interval),
        backoff_base=_pick(backoff_base, "SMON_AGENT_BACKOFF_BASE", d.backoff_base),
        backoff_cap=_pick(backoff_cap, "SMON_AGENT_BACKOFF_CAP", d.backoff_cap),
        max_batch_records=max(
            1, int(_pick(max_batch_records, "SMON_AGENT_BATCH_RECORDS", d.max_batch_records, integer=True))
        ),
        compression=_compression(compression or os.environ.get("SMON_AGENT_COMPRESSION", "")),
        device_sampling=_device_sampling(
            os.environ.get("SMON_AGENT_DEVICE_SAMPLING", "") if device_sampling is None else device_sampling
        ),
        relay=_relay(os.environ.get("SMON_AGENT_RELAY", "")),
        relay_fallback=_pick(None, "SMON_AGENT_RELAY_FALLBACK", d.relay_fallback),
    )


def _relay(raw: str) -> bool:
    """on / off, or auto (the default): on when this host runs several ranks (LOCAL_WORLD_SIZE)."""
    value = raw.strip().lower() or "auto"
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    if value != "auto":
        logger.warning("smon: ignoring SMON_AGENT_RELAY=%r (on, off or auto)", raw)
    return (env_int("LOCAL_WORLD_SIZE") or 1) > 1


def _device_sampling(raw: int | str) -> int | None:
    """A period (rounded up to a power of two) or None for `auto`."""
    text = str(raw).strip().lower()
    if text in ("", "auto"):
        return None
    try:
        period = int(text)
    except ValueError:
        period = 0
    if period < 1:
        logger.warning("smon: ignoring device sampling %r (auto, or a period of at least 1)", raw)
        return None
    power = 1
    while power < period:
        power *= 2
    return power


def _compression(raw: str) -> str:
    value = raw.strip().lower() or "none"
    if value not in ("none", "gzip"):
        logger.warning("smon: ignoring SMON_AGENT_COMPRESSION=%r (none or gzip)", raw)
        return "none"
    return value
