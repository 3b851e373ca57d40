"""Device time hidden behind the host (issue 29, whatif/inputs/host_line.py).

A two-lane simulation of a DDP GPU job: the host issues each phase (taking `host` seconds), the
device runs its kernels in order as soon as they are issued and it is free, and CUDA-event marks
read the device's time when it reaches them. The gradient all-reduce is gloo on the CPU: the host
waits for its device's gradients, then for every rank. The agent's records carry each span's
device time and its host view, as the real agent sends them. Truth is the simulated step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from smon_server.columns import StepColumns
from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.diagnosis import stragglers
from smon_server.whatif.engine import analyze
from smon_server.whatif.inputs.from_steps import build_op_table, complete_steps
from smon_server.whatif.inputs.host_line import replay_line
from tests.whatif.step_records import StepRow

ROBUST = WhatIfConfig(estimator="robust")


@dataclass
class Phase:
    name: str
    host: float  # seconds the host spends issuing it
    device: float  # seconds its kernels run on the device


def simulate(
    ranks: int,
    steps: int,
    phases: dict[int, list[Phase]],
    *,
    transfer: float = 0.004,
    jitter: float = 0.0003,
    host_view: bool = True,
) -> tuple[list[StepRow], float]:
    """Rows and the mean step time. `phases[r]` is rank r's compute before the all-reduce."""
    rng = np.random.default_rng(7)
    rows: list[StepRow] = []
    t = 0.0
    lengths = []
    for step in range(steps):
        ready, lanes = [], []
        for r in range(ranks):
            host = device = t  # both lanes start the step together (the previous step synced)
            spans = []
            for phase in phases[r]:
                h = max(0.0, phase.host + jitter * rng.standard_normal())
                mark_start = max(host, device)  # the start event runs when the device reaches it
                device = max(device, host) + phase.device  # kernels queue behind earlier ones
                host += h
                mark_end = max(host, device)
                spans.append((phase.name, mark_start, mark_end, host - h, h))
            ready.append(max(host, device))  # gloo copies the gradients: waits for the device
            lanes.append(spans)
        end_sync = max(ready) + transfer
        length = end_sync + 0.001 - t  # the optimizer, on the host, after the sync
        for r in range(ranks):
            recorded = []
            for name, d0, d1, h0, h in lanes[r]:
                row: tuple = (name, d0 - t, d1 - d0, -1, 0)
                if host_view:
                    row = (*row, h0 - t, h)
                recorded.append(row)
            sync = ("grad_sync", ready[r] - t, end_sync - ready[r], -1, 0)
            recorded.append((*sync, ready[r] - t, end_sync - ready[r]) if host_view else sync)
            rows.append(
                StepRow(
                    rank=r, step=step, dp_rank=r, pp_rank=0, tp_rank=0, start_time=t,
                    duration=length, phases={}, spans=recorded,
                )
            )  # fmt: skip
        lengths.append(length)
        t += length
    return rows, float(np.mean(lengths[1:]))


def analysed(rows: list[StepRow]) -> tuple[float, list[tuple[int, str]]]:
    table = build_op_table(complete_steps(StepColumns.from_rows(rows)))
    result = analyze(table, config=ROBUST)
    named = [(int(result.worker_rank[s.dp_index, s.stage_index]), s.cause) for s in stragglers(table, result)]
    return result.slowdown, named


def host_bound(extra_device: float) -> dict[int, list[Phase]]:
    """Launch-bound phases: the host takes longer to issue each than the device to run it."""
    base = [Phase("forward", 0.008, 0.003), Phase("backward", 0.014, 0.006)]
    slow = [Phase("forward", 0.008, 0.003 + extra_device), Phase("backward", 0.014, 0.006)]
    return {0: base, 1: slow, 2: base, 3: base}


@pytest.mark.parametrize("ranks", [2, 4])
def test_device_work_the_host_hides_costs_nothing_and_names_nobody(ranks: int) -> None:
    """Rank 1's forward grows by a 10 ms kernel while the host stays the bottleneck (its slack is
    13 ms): the step takes no longer (truth), so S stays at 1 and nobody is named. On the device
    line alone the replay reads a slowdown (the test would fail without the host views)."""
    _, clean = simulate(ranks, 200, host_bound(0.0))
    rows, mean = simulate(ranks, 200, host_bound(0.010))
    assert mean == pytest.approx(clean, rel=1e-3)  # hidden: the job did not slow down
    s, named = analysed(rows)
    assert s <= 1.03
    assert named == []
    device_only, _ = simulate(ranks, 200, host_bound(0.010), host_view=False)
    s_device_line, _ = analysed(device_only)
    assert s_device_line > 1.03


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_slow_gpu_on_a_device_bound_job_is_still_measured_on_the_device(ranks: int) -> None:
    """The host races ahead and waits in the gradient sync; rank 1's device is 1.8x slower: the
    device line is the critical path, the rank is named and S is within 10% of the truth."""
    base = [Phase("forward", 0.001, 0.010), Phase("backward", 0.001, 0.020)]
    slow = [Phase("forward", 0.001, 0.018), Phase("backward", 0.001, 0.036)]
    phases = {r: (slow if r == 1 else base) for r in range(ranks)}
    _, clean = simulate(ranks, 200, {r: base for r in range(ranks)})
    rows, mean = simulate(ranks, 200, phases)
    truth = mean / clean
    assert truth > 1.3
    s, named = analysed(rows)
    assert s == pytest.approx(truth, rel=0.10)
    assert [rank for rank, _ in named] == [1]
    cols = StepColumns.from_rows(rows)
    assert replay_line(cols, {})[1] == 0  # no record read on the host line


def test_a_slowdown_past_the_hosts_slack_is_measured() -> None:
    """Rank 1's extra kernel outlasts the host's slack: the step does slow down, and S says so.

    Its records are device-bound, its peers' host-bound: rank 1's backward on the device is its
    kernels alone (the host issued it long before), its peers' backward is the host's issue time.
    An ideal taking the faster of each phase would be shorter than the host allows (S 2.3 against
    a true 1.6); the host floor on D* keeps it to what the host can issue."""
    _, clean = simulate(2, 200, host_bound(0.0))
    rows, mean = simulate(2, 200, host_bound(0.030))
    truth = mean / clean
    assert truth > 1.2
    s, named = analysed(rows)
    assert s == pytest.approx(truth, rel=0.10)
    assert [rank for rank, _ in named] == [1]


def test_records_without_host_views_are_left_as_they_are() -> None:
    rows, _ = simulate(2, 10, host_bound(0.010), host_view=False)
    cols = StepColumns.from_rows(rows)
    assert not cols.has_host
    assert replay_line(cols, {})[0] is cols
