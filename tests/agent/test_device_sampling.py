"""The CUDA path's budget, counted with FakeCuda: what each step would cost on a GPU.

Per steady-state step of a training loop (data loader, model, optimizer): no CUDA event is
constructed (they come from a pool and go back once read), a device-timed step records at most
`K` events and an untimed one none, the read-back makes at most 2 `query()` calls per step, and
the stream is looked up once per timed block. docs/agent.md ("CUDA") states the same numbers.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn

from smon.cuda_timing import POOL_SIZE, CudaClock
from smon.records import to_step_record
from smon.sampling import BLOCK, MAX_PERIOD, DeviceSampling, period_for
from smon.steps import StepTracker
from smon.testing import FakeCuda
from tests.agent.conftest import op_spans

K = 10  # events a device-timed step of a one-micro-batch loop may record (docs/agent.md)
FORWARD_MS = 3.0


class DeviceWork(nn.Module):
    """Advances FakeCuda's device clock by FORWARD_MS per forward, as a kernel would."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.fake_cuda = cuda
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fake_cuda.advance(FORWARD_MS)
        return self.lin(x)


def test_every_rank_times_the_same_blocks_and_coarser_periods_nest() -> None:
    steps = range(10_000)
    by_period = {p: {s for s in steps if DeviceSampling(p).timed(s)} for p in (1, 2, 4, 8, 16)}
    assert by_period[1] == set(steps)
    for p in (2, 4, 8, 16):
        again = {s for s in steps if DeviceSampling(p).timed(s)}
        assert again == by_period[p]  # another rank, the same steps
        assert by_period[p] <= by_period[p // 2]  # ranks at P and 2P share the 2P steps
        blocks = {s // BLOCK for s in by_period[p]}
        assert all(all(b * BLOCK + i in by_period[p] for i in range(BLOCK)) for b in blocks)
        share = len(by_period[p]) / len(steps)
        assert 0.6 / p < share < 1.5 / p


def test_timed_blocks_do_not_alias_with_periodic_work() -> None:
    """An evaluation every 20 steps falls in timed blocks about as often as any step does."""
    sampling = DeviceSampling(8)
    evals = [s for s in range(0, 40_000, 20)]
    share = sum(sampling.timed(s) for s in evals) / len(evals)
    assert 0.6 / 8 < share < 1.5 / 8


def test_auto_period_follows_the_step_time_with_hysteresis() -> None:
    assert period_for(0.2) == 1
    assert period_for(0.008) == 16
    assert period_for(0.023) == 8
    assert period_for(1e-5) == MAX_PERIOD
    sampling = DeviceSampling()
    assert sampling.period == 1  # until the step time is known
    for _ in range(50):
        sampling.observe(0.008)
    assert sampling.period == 16
    # a step time just past the boundary between 16 and 8 does not move it
    boundary = 2e-4 / (2e-3 * 8)
    assert period_for(boundary * 1.01) == 8
    for _ in range(100):
        sampling.observe(boundary * 1.01)
    assert sampling.period == 16
    for _ in range(100):
        sampling.observe(0.2)
    assert sampling.period == 1


def test_auto_period_follows_the_typical_step_not_its_pauses() -> None:
    """A 2 s pause every 20 steps of 6 ms (an evaluation; another model's turn in an interleaved
    benchmark, where the H200 run at ef787b5 saw this) makes the mean step ~100 ms: the period
    stays the one of a 6 ms step, and starts there from 1 even though 6 ms is near a boundary."""
    assert period_for(0.006 * 0.8) != period_for(0.006 * 1.2)  # near a boundary
    sampling = DeviceSampling()
    for step in range(400):
        sampling.observe(2.0 if step % 20 == 19 else 0.006)
    assert sampling.period == period_for(0.006) == 32
    # a job whose steps really do slow down moves with them
    for _ in range(64):
        sampling.observe(0.05)
    assert sampling.period == period_for(0.05) == 2


def _loop(cuda: FakeCuda, clock: CudaClock, ingest, attach_fast, steps: int, chunk: int = 20):
    """`steps` steps in chunks: after each, the device catches up (every event completes) and the
    test waits until the agent has shipped what it timed, so at most a chunk's events are ever in
    flight, whatever this machine's load does to the feeder thread's timing."""
    model = DeviceWork(cuda)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data: Any = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)  # type: ignore[arg-type]
    sampling = clock.sampling
    mon = attach_fast(model, optimizer, data, server=ingest.address, timing=clock)
    per_step: list[tuple[int, int, int, int]] = []  # (step, recorded, created, stream lookups)
    done = 0
    before = (cuda.recorded, cuda.created, cuda.stream_lookups)
    while done < steps:
        for x in data:  # (the loader's next() is part of the step it feeds)
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            after = (cuda.recorded, cuda.created, cuda.stream_lookups)
            per_step.append((done, after[0] - before[0], after[1] - before[1], after[2] - before[2]))
            before = after
            done += 1
            if done % chunk == 0 or done == steps:
                cuda.complete_all()  # the device has caught up
                # (the step that ends a block's last step is read once the next one starts)
                want = {s for s in range(done - 1) if sampling.timed(s)}
                assert ingest.servicer.wait_for(lambda s, w=want: w <= set(s.step_numbers()), timeout=10)
            if done == steps:
                break
    return mon, per_step


def test_a_training_loop_stays_within_the_event_budget(ingest, attach_fast) -> None:
    cuda = FakeCuda()
    sampling = DeviceSampling(4)
    clock = CudaClock(cuda, sampling=sampling)
    steps, warmup = 240, 40
    mon, per_step = _loop(cuda, clock, ingest, attach_fast, steps)
    queries_before_close = cuda.queries
    timed = {s for s in range(steps) if sampling.timed(s)}
    mon.close()
    steady = per_step[warmup:]
    assert sum(created for _, _, created, _ in steady) == 0  # the pool, no construction
    assert clock.created <= POOL_SIZE + 20 * K  # grown at most to a chunk's events in flight
    for step, recorded, _, _ in steady:
        if step in timed:
            assert 0 < recorded <= K
        elif step + 1 in timed:
            assert recorded == 1  # its end: where the timed block starts
        else:
            assert recorded == 0  # an untimed step costs the device nothing
    blocks = {s // BLOCK for s in range(warmup, steps) if s in timed}
    assert sum(lookups for *_, lookups in steady) <= len(blocks) + 1
    assert queries_before_close <= 2 * steps
    # exactly the timed steps arrive, each with the device's own forward time
    shipped = {s.step: s for s in ingest.servicer.steps()}
    assert set(shipped) == timed
    for record in shipped.values():
        forward = [s for s in op_spans(record) if s.kind == "forward"]
        assert [s.duration for s in forward] == [pytest.approx(FORWARD_MS / 1e3)]
        assert Counter(s.kind for s in op_spans(record)) == Counter(
            {"data_wait": 1, "forward": 1, "backward": 1, "optimizer": 1}
        )


def test_events_come_back_to_the_pool_while_the_device_lags(ingest, attach_fast) -> None:
    """The device finishes only every 25 steps (the host far ahead): every step is timed, events
    wait in flight, and still none is made once the pool has grown to what is in flight."""
    cuda = FakeCuda()
    clock = CudaClock(cuda, sampling=DeviceSampling(1))
    mon, per_step = _loop(cuda, clock, ingest, attach_fast, 300, chunk=25)
    mon.close()
    grown = sum(created for _, _, created, _ in per_step[:100])
    assert sum(created for _, _, created, _ in per_step[100:]) == 0
    assert POOL_SIZE + grown == clock.created <= POOL_SIZE + 25 * K


def test_a_gc_pause_in_an_untimed_step_is_not_given_to_the_next_timed_one() -> None:
    cuda = FakeCuda()
    sampling = DeviceSampling(4)
    pauses: list[tuple[float, float]] = []
    clock = CudaClock(cuda, sampling=sampling)
    tracker = StepTracker(clock, gc_drain=lambda: [pauses.pop()] if pauses else [])
    untimed = next(s for s in range(1, 1000) if not sampling.timed(s) and sampling.timed(s + 1))
    for step in range(untimed + 2):
        if step == untimed:
            pauses.append((time.perf_counter(), 0.05))  # a collection during the untimed step
        tracker.close("forward", tracker.open("forward"))
        tracker.end_step()
        if step < untimed:
            tracker.collect()
    cuda.complete_all()
    raws = tracker.collect()
    assert [r.step for r in raws] == [untimed + 1]
    assert raws[0].gc_pauses == []
    record = to_step_record(raws[0])
    assert record is not None and record.gc_count == 0
