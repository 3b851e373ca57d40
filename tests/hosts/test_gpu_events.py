"""GPU health events from NVML readings: XIDs, new uncorrectable ECC, throttle time by reason."""

from __future__ import annotations

import pytest

from smon_server.hosts.gpu_events import MAX_GAP, Reading, derive

HW_THERMAL, SW_POWER = 0x40, 0x4


def r(t: float, *, bits: int = 0, ecc: int | None = 0, xids: tuple[int, ...] = ()) -> Reading:
    return Reading(time=t, gpu_uuid="GPU-a", throttle_reasons=bits, ecc_uncorrected=ecc, xid_events=xids)


def test_each_xid_is_an_event_with_its_time_and_code() -> None:
    events = derive([r(0), r(5, xids=(79,)), r(10, xids=(48, 94))], previous=None, known_ecc={})
    assert [(e.kind, e.time, e.code) for e in events] == [("xid", 5, 79), ("xid", 10, 48), ("xid", 10, 94)]


def test_uncorrectable_ecc_counts_only_what_is_new() -> None:
    # The first reading's count is new when SMon never recorded that GPU's counter ...
    events = derive([r(0, ecc=2), r(5, ecc=2), r(10, ecc=5)], previous=None, known_ecc={})
    assert [(e.time, e.value, e.total) for e in events] == [(0, 2.0, 2), (10, 3.0, 5)]
    # ... and not when it was recorded already (a later job on the same GPU).
    again = derive([r(0, ecc=5), r(5, ecc=5)], previous=None, known_ecc={"GPU-a": 5})
    assert again == []
    # A scan continuing an earlier one compares with the last reading it saw.
    more = derive([r(15, ecc=6)], previous=r(10, ecc=5), known_ecc={"GPU-a": 5})
    assert [(e.value, e.total) for e in more] == [(1.0, 6)]


def test_throttle_time_is_merged_per_reason_and_sampling_gaps_do_not_count() -> None:
    readings = [
        r(0, bits=HW_THERMAL),
        r(5, bits=HW_THERMAL | SW_POWER),
        r(10, bits=0),
        r(15, bits=HW_THERMAL),
        r(15 + MAX_GAP + 10, bits=0),  # a long gap: not known to have throttled all along
    ]
    events = derive(readings, previous=None, known_ecc={})
    throttle = [(e.reason, e.time, e.value) for e in events if e.kind == "throttle"]
    assert throttle == [("hw_thermal", 0, 10.0), ("sw_power_cap", 5, 5.0)]
    assert sum(e.value for e in events if e.kind == "throttle") == pytest.approx(15.0)


def test_a_scan_continuing_another_counts_the_interval_since_the_last_reading() -> None:
    events = derive([r(20, bits=0)], previous=r(15, bits=HW_THERMAL), known_ecc={})
    assert [(e.reason, e.time, e.value) for e in events] == [("hw_thermal", 15, 5.0)]
