"""GPU health events of one rank's GPUs, derived from its stored NVML samples.

Samples are readings every few seconds; a platform engineer wants events: an XID error and when,
uncorrectable ECC errors that are new (the counter grew, or a GPU first seen with errors SMon had
not seen on it before), and how long the GPU throttled, by reason. Throttle time counts the
interval from a sample to the next one with the reason bits of the first (at most MAX_GAP
seconds: a gap in sampling is not time spent throttling), merged into stretches per reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# NVML clock-event reason bits that mean the GPU slowed itself down, by name.
REASONS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
THERMAL = frozenset({"sw_thermal", "hw_thermal"})
POWER = frozenset({"sw_power_cap", "hw_power_brake", "hw_slowdown"})
MAX_GAP = 30.0


@dataclass(frozen=True)
class Reading:
    """What event derivation needs of one NVML sample."""

    time: float
    gpu_uuid: str
    throttle_reasons: int | None
    ecc_uncorrected: int | None
    xid_events: Sequence[int]


@dataclass(frozen=True)
class Event:
    kind: str  # xid, ecc_uncorrected, throttle
    time: float
    gpu_uuid: str
    code: int | None = None
    reason: str = ""
    value: float = 0.0
    total: int | None = None


def derive(
    readings: Sequence[Reading],
    *,
    previous: Reading | None,
    known_ecc: Mapping[str, int],
) -> list[Event]:
    """Events of one GPU's `readings` (time order), following `previous` (the last reading an
    earlier derivation saw, or None). `known_ecc`: the last uncorrectable-ECC counter SMon
    recorded per GPU UUID, the baseline of a GPU's first reading in a job."""
    events: list[Event] = []
    last = previous
    open_stretch: dict[str, Event] = {}
    for r in readings:
        for code in r.xid_events or ():
            events.append(Event("xid", r.time, r.gpu_uuid, code=int(code), value=1.0))
        if r.ecc_uncorrected is not None:
            if last is not None and last.ecc_uncorrected is not None:
                base = last.ecc_uncorrected
            else:
                base = known_ecc.get(r.gpu_uuid, 0)
            if r.ecc_uncorrected > base:
                events.append(
                    Event(
                        "ecc_uncorrected",
                        r.time,
                        r.gpu_uuid,
                        value=float(r.ecc_uncorrected - base),
                        total=r.ecc_uncorrected,
                    )
                )
        if last is not None:
            gap = r.time - last.time
            bits = last.throttle_reasons or 0
            reasons = {name for bit, name in REASONS.items() if bits & bit} if 0 < gap <= MAX_GAP else set()
            for name in list(open_stretch):
                if name not in reasons:
                    events.append(open_stretch.pop(name))
            for name in reasons:
                stretch = open_stretch.get(name)
                seconds = gap + (stretch.value if stretch else 0.0)
                start = stretch.time if stretch else last.time
                open_stretch[name] = Event("throttle", start, r.gpu_uuid, reason=name, value=seconds)
        last = r
    events.extend(open_stretch.values())
    return sorted(events, key=lambda e: (e.time, e.kind, e.reason))
