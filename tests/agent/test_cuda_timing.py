"""The CUDA-event timing path, on CPU, with FakeCuda's events and controllable device clock."""

from __future__ import annotations

import time
from array import array
from typing import Any

import pytest
import torch
from torch import nn

from smon.cuda_timing import CudaClock
from smon.records import to_step_record
from smon.steps import StepTracker
from smon.table import to_table
from smon.testing import FakeCuda
from smon.timing import HostClock
from tests.agent.conftest import op_spans


class DeviceWork(nn.Module):
    """Pretends to launch `device_ms` of GPU work while the CPU spends `cpu_seconds`."""

    def __init__(self, cuda: FakeCuda, device_ms: float, cpu_seconds: float) -> None:
        super().__init__()
        self.fake_cuda, self.device_ms, self.cpu_seconds = cuda, device_ms, cpu_seconds
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.cpu_seconds)
        self.fake_cuda.advance(self.device_ms)
        return self.lin(x)


def test_steps_wait_for_their_events_and_use_device_time(ingest, attach_fast):
    cuda = FakeCuda()
    mon = attach_fast(server=ingest.address, timing=CudaClock(cuda, device="cuda:0"))
    with mon.phase("forward", microbatch=0):
        cuda.advance(30.0)
    with mon.phase("optimizer"):
        cuda.advance(5.0)
    cuda.advance(1.0)
    mon.step()
    deadline = time.monotonic() + 5
    while cuda.queries < 3 and time.monotonic() < deadline:  # the shipper has looked, repeatedly...
        time.sleep(0.01)
    assert cuda.queries >= 3 and ingest.servicer.steps() == []  # ...and held the step back
    cuda.complete_all()
    assert ingest.servicer.wait_for(lambda s: len(s.steps()) == 1)
    mon.close()
    (step,) = ingest.servicer.steps()
    assert step.duration == pytest.approx(0.036)
    forward, optimizer = op_spans(step)
    assert (forward.kind, forward.duration) == ("forward", pytest.approx(0.030))
    assert forward.start == step.start_time
    assert optimizer.duration == pytest.approx(0.005)
    assert optimizer.start - step.start_time == pytest.approx(0.030)
    if step.gc_count == 0:
        assert step.phases["other"] == pytest.approx(0.001)


def test_model_hooks_on_the_cuda_path(ingest, attach_fast):
    cuda = FakeCuda()
    model = DeviceWork(cuda, device_ms=7.0, cpu_seconds=0.02)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = attach_fast(model, optimizer, server=ingest.address, timing=CudaClock(cuda))
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    cuda.complete_all()
    assert ingest.servicer.wait_for(lambda s: len(s.steps()) == 2)
    mon.close()
    for step in ingest.servicer.steps():
        assert [s.kind for s in op_spans(step)] == ["forward", "backward", "optimizer"]
        # the forward span is the device's 7 ms, not the CPU's 20 ms; the host's is beside it
        forward = op_spans(step)[0]
        assert forward.duration == pytest.approx(0.007)
        assert forward.host_duration >= 0.02
        assert all(s.HasField("host_duration") for s in op_spans(step))


def test_host_durations_travel_in_step_tables() -> None:
    cuda = FakeCuda()
    tracker = StepTracker(CudaClock(cuda))
    start = tracker.open("forward")
    time.sleep(0.01)
    cuda.advance(2.0)
    tracker.close("forward", start)
    tracker.end_step()
    cuda.complete_all()
    (raw,) = tracker.collect()
    record = to_step_record(raw)
    assert record is not None
    table = to_table([record])
    (host,) = array("d", table.span_host_duration)
    assert host == pytest.approx(record.spans[0].host_duration) and host >= 0.01
    (host_start,) = array("d", table.span_host_start)
    assert host_start == record.spans[0].host_start == pytest.approx(record.start_time)
    assert record.spans[0].duration == pytest.approx(0.002)
    host_only = to_step_record(_host_step())
    assert host_only is not None and not to_table([host_only]).span_host_duration


def _host_step() -> Any:
    tracker = StepTracker(HostClock())
    tracker.close("forward", tracker.open("forward"))
    tracker.end_step()
    (raw,) = tracker.collect()
    return raw


def test_events_that_never_complete_fall_back_to_host_time(ingest, attach_fast):
    cuda = FakeCuda()
    mon = attach_fast(server=ingest.address, timing=CudaClock(cuda))
    with mon.phase("checkpoint"):
        time.sleep(0.02)
    mon.step()
    mon.close()  # the events never completed: close ships the step read by host time
    (step,) = ingest.servicer.steps()
    assert op_spans(step)[0].duration >= 0.02


def test_read_back_timeout():
    cuda = FakeCuda()
    tracker = StepTracker(CudaClock(cuda))
    tracker.close("forward", tracker.open("forward"))
    tracker.end_step()
    (raw,) = tracker.collect()
    assert to_step_record(raw, timeout=60) is None  # still in flight
    record = to_step_record(raw, timeout=0.0)  # given up on: host times
    assert record is not None and record.spans[0].kind == "forward"
