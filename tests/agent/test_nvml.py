"""The GPU sampler against FakeNvml (same calls as pynvml) and against the real pynvml without a GPU."""

from __future__ import annotations

import logging

import pytest

from smon.errors import ErrorCounter
from smon.nvml import GpuSampler
from smon.testing import HW_THERMAL_SLOWDOWN, SW_THERMAL_SLOWDOWN, FakeNvml
from smon.v1 import ingest_pb2 as pb


def sampler_for(nvml: FakeNvml, **kwargs) -> tuple[GpuSampler, list[pb.GpuSample]]:
    samples: list[pb.GpuSample] = []
    return GpuSampler(samples.append, ErrorCounter(), interval=0.01, nvml=nvml, **kwargs), samples


def read(nvml: FakeNvml, n: int = 1, **kwargs) -> tuple[GpuSampler, list[pb.GpuSample]]:
    sampler, _ = sampler_for(nvml, **kwargs)
    nvml.nvmlInit()
    handle = sampler.open_device(nvml)
    return sampler, [sampler.sample(nvml, handle) for _ in range(n)]


def test_healthy_gpu_sample_has_every_field_in_base_units():
    _, (s,) = read(FakeNvml())
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz) == (1980, 1980)
    assert (s.mem_clock_mhz, s.mem_clock_max_mhz) == (2619, 2619)
    assert (s.gpu_util, s.mem_util, s.temperature_c) == (97, 41, 62)
    assert (s.power_w, s.power_limit_w) == (610.0, 700.0)
    assert s.mem_total_bytes == 80 * 2**30 and s.mem_used_bytes == 60 * 2**30
    assert (s.throttle_reasons, s.ecc_corrected, s.ecc_uncorrected, s.pcie_replay) == (0, 0, 0, 0)
    assert s.HasField("throttle_reasons") and s.gpu_uuid.startswith("GPU-fake") and s.time > 0


def test_throttled_gpu_reports_clock_event_bits():
    _, (s,) = read(FakeNvml.throttled())
    assert s.sm_clock_mhz < s.sm_clock_max_mhz
    assert s.throttle_reasons & SW_THERMAL_SLOWDOWN and s.throttle_reasons & HW_THERMAL_SLOWDOWN
    assert s.temperature_c >= 90


def test_ecc_errors_and_xid_events():
    nvml = FakeNvml.ecc_errors()
    _, (first, second) = read(nvml, n=2)
    assert (first.ecc_corrected, first.ecc_uncorrected) == (120, 2)
    assert list(first.xid_events) == [48] and list(second.xid_events) == []  # each event read once
    nvml.inject_xid(79)
    sampler, _ = sampler_for(nvml)
    handle = sampler.open_device(nvml)
    assert list(sampler.sample(nvml, handle).xid_events) == [79]


def test_missing_fields_are_said_once_and_not_asked_again(caplog):
    nvml = FakeNvml(
        missing={"nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceRegisterEvents"}
    )
    with caplog.at_level(logging.INFO, logger="smon"):
        _, samples = read(nvml, n=3)
    for s in samples:
        assert not s.HasField("pcie_replay") and not s.HasField("ecc_corrected")
        assert not s.HasField("ecc_uncorrected") and s.HasField("sm_clock_mhz")
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "pcie_replay not available" in m]) == 1
    assert len([m for m in messages if "ecc_corrected not available" in m]) == 1
    assert len([m for m in messages if "XID events not readable" in m]) == 1
    assert nvml.calls["nvmlDeviceGetPcieReplayCounter"] == 1  # stopped asking after the first refusal


def test_no_driver_is_said_once_and_the_thread_ends(caplog):
    sampler, samples = sampler_for(FakeNvml(no_driver=True))
    with caplog.at_level(logging.INFO, logger="smon"):
        sampler.start()
        sampler._thread.join(2)  # type: ignore[union-attr]
    assert not sampler._thread.is_alive() and samples == []  # type: ignore[union-attr]
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1


def test_no_gpu_is_said_once(caplog):
    sampler, samples = sampler_for(FakeNvml(0))
    with caplog.at_level(logging.INFO, logger="smon"):
        sampler.start()
        sampler._thread.join(2)  # type: ignore[union-attr]
    assert samples == [] and any("sees no GPU" in r.getMessage() for r in caplog.records)


def test_picks_this_ranks_gpu(monkeypatch):
    nvml = FakeNvml(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    sampler, (s,) = read(nvml, local_rank=1)
    assert (sampler.gpu_index, s.gpu_index, s.gpu_uuid) == (5, 5, nvml.uuids[5])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    _, (s,) = read(nvml, local_rank=2, gpu_uuid=nvml.uuids[6])  # torch told us the UUID
    assert s.gpu_index == 6
    _, (s,) = read(nvml, local_rank=2)
    assert s.gpu_index == 2


def test_samples_reach_the_server_and_fill_the_gpu_uuid(ingest, attach_fast):
    nvml = FakeNvml.throttled()
    mon = attach_fast(server=ingest.address, nvml=nvml, nvml_interval=0.02)
    assert ingest.servicer.wait_for(lambda s: sum(len(b.gpu_samples) for b in s.snapshot()) >= 3)
    assert ingest.servicer.wait_for(lambda s: s.snapshot()[-1].coords.gpu_uuid == nvml.uuids[0])
    mon.close()
    sample = next(g for b in ingest.servicer.snapshot() for g in b.gpu_samples)
    assert sample.throttle_reasons == SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN


def test_fake_nvml_from_environment(ingest, attach_fast, monkeypatch):
    monkeypatch.setenv(
        "SMON_FAKE_NVML", "throttled,ecc,missing=nvmlDeviceGetPcieReplayCounter,temperature=95"
    )
    mon = attach_fast(server=ingest.address, nvml_interval=0.02)
    assert ingest.servicer.wait_for(lambda s: any(b.gpu_samples for b in s.snapshot()))
    mon.close()
    sample = next(g for b in ingest.servicer.snapshot() for g in b.gpu_samples)
    assert sample.temperature_c == 95 and sample.ecc_uncorrected == 2 and sample.throttle_reasons
    assert not sample.HasField("pcie_replay")


def test_from_spec_rejects_unknown_items():
    with pytest.raises(ValueError):
        FakeNvml.from_spec("overclocked")


def test_real_pynvml_without_a_gpu_is_said_once(caplog):
    pytest.importorskip("pynvml")
    samples: list[pb.GpuSample] = []
    sampler = GpuSampler(samples.append, ErrorCounter(), interval=0.01)
    with caplog.at_level(logging.INFO, logger="smon"):
        sampler.start()
        sampler._thread.join(5)  # type: ignore[union-attr]
    if samples:  # this machine has a GPU after all: the real sampler worked
        assert samples[0].gpu_uuid
        sampler.stop()
        return
    said = [r for r in caplog.records if "NVML" in r.getMessage() or "GPU" in r.getMessage()]
    assert len(said) == 1
