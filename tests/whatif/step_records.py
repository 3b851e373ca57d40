"""Step records of a simulated synchronous DDP job, shaped like the store's rows, with known truth.

Each rank runs: untimed host work, data wait, forward, backward, then the gradient all-reduce,
which ends `transfer` after the last rank is ready (the others wait in it), then the optimizer.
Anything a rank does before its data wait (rank 0's evaluation, a sleep) is untimed unless given
as a named span. The job's true mean step time is what the simulation took, so a test can compare
S with the speed-up that removing the injected work really gives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StepRow:
    """One step record as rows (smon_server.columns.StepLike)."""

    rank: int
    step: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    start_time: float
    duration: float
    phases: Mapping[str, float]
    spans: Sequence[Sequence[Any]]  # [kind, start (relative to step start), duration, mb, chunk]
    seq_sum_sq: float = 0.0
    microbatch_seq: Sequence[Sequence[Any]] = ()  # [mb, count, tokens, sum_sq, max_len]


# Per (rank, step): extra seconds, or None.
Injection = Callable[[int, int], float]


def _none(rank: int, step: int) -> float:
    return 0.0


@dataclass
class DdpJob:
    ranks: int = 2
    steps: int = 40
    data_wait: float = 0.002
    forward: float = 0.010
    backward: float = 0.020
    transfer: float = 0.004
    optimizer: float = 0.003
    host_gap: float = 0.0005  # untimed glue between phases on every rank
    extra_forward: Injection = _none  # inside forward (a slow GPU)
    extra_data: Injection = _none  # inside data wait (a slow loader)
    untimed: Injection = _none  # before the data wait, outside every phase
    eval_span: Injection = _none  # before the data wait, as an `eval` span
    gc_pause: Injection = _none  # a GC pause inside backward
    jitter: Callable[[int, int], float] = field(default=_none)  # added to forward


def simulate(job: DdpJob) -> tuple[list[StepRow], float]:
    """(step rows of every rank, the job's true mean step time: wall time / steps)."""
    rows: list[StepRow] = []
    clock = [1000.0] * job.ranks
    for step in range(job.steps):
        spans: list[list[list[object]]] = [[] for _ in range(job.ranks)]
        ready = []
        starts = list(clock)
        for r in range(job.ranks):
            t = 0.0  # relative to this rank's step start
            pre = job.untimed(r, step)
            ev = job.eval_span(r, step)
            t += job.host_gap + pre
            if ev:
                spans[r].append(["eval", t, ev, -1, 0])
                t += ev + job.host_gap
            dw = job.data_wait + job.extra_data(r, step)
            spans[r].append(["data_wait", t, dw, -1, 0])
            t += dw + job.host_gap
            fw = job.forward + job.extra_forward(r, step) + job.jitter(r, step)
            spans[r].append(["forward", t, fw, 0, 0])
            t += fw + job.host_gap
            gc = job.gc_pause(r, step)
            bw = job.backward + gc
            spans[r].append(["backward", t, bw, 0, 0])
            if gc:
                spans[r].append(["gc", t + job.backward / 2, gc, -1, 0])
            t += bw
            ready.append(starts[r] + t)
        sync_end = max(ready) + job.transfer
        ends = []
        for r in range(job.ranks):
            rel_ready = ready[r] - starts[r]
            spans[r].append(["grad_sync", rel_ready, sync_end - ready[r], -1, 0])
            rel_opt = sync_end - starts[r]
            spans[r].append(["optimizer", rel_opt, job.optimizer, -1, 0])
            end = sync_end + job.optimizer
            ends.append(end)
            rows.append(
                StepRow(
                    rank=r,
                    step=step,
                    dp_rank=r,
                    pp_rank=0,
                    tp_rank=0,
                    start_time=starts[r],
                    duration=end - starts[r],
                    phases={},
                    spans=spans[r],
                )
            )
        clock = ends
    return rows, (max(clock) - 1000.0) / job.steps
