"""The fleet-scale job benchmark's straggler onset: the simulated ranks' steps turn slow (and their
peers wait) exactly at the onset step, also inside a batch, and the time to flag is read from the
first summary that names the straggler after it."""

from __future__ import annotations

import numpy as np

from benchmarks.fleet import StepTables
from benchmarks.fleet_job import Onset, Polls, RankAgent, time_to_flag
from smon.config import AgentConfig
from smon.v1 import ingest_pb2 as pb


def _steps(agent: RankAgent, upto: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, step durations, each step's grad_sync span duration) of its next batch."""
    batch = pb.Batch.FromString(agent.batch(0.0, 1000.0, upto, 0))
    table = batch.step_table
    spans = np.frombuffer(table.span_duration, "<f8").reshape(table.records, -1)
    sync = list(table.kinds).index("grad_sync")
    kinds = np.frombuffer(table.span_kind, "<u2").reshape(table.records, -1)
    assert (kinds[:, 3] == sync).all()
    return np.frombuffer(table.step, "<i8"), np.frombuffer(table.duration, "<f8"), spans[:, 3]


def test_the_onset_splits_a_batch_at_its_step() -> None:
    onset = Onset(step=5, rank=1, forward=0.3)
    slow, peer = onset.tables()
    normal = StepTables()
    agents = [
        RankAgent("j", r, 4, 1.0, normal, AgentConfig(), (5, slow if r == 1 else peer)) for r in range(4)
    ]
    for agent in agents:
        steps, durations, _ = _steps(agent, 3)  # before the onset: all alike
        assert list(steps) == [0, 1, 2] and np.allclose(durations, normal.step_seconds)
    straggler, waiting = _steps(agents[1], 8), _steps(agents[0], 8)
    assert list(straggler[0]) == list(waiting[0]) == [3, 4, 5, 6, 7]
    # Steps 3 and 4 as before; from step 5 the step is 0.3 s longer on every rank, the
    # straggler's in its forward, its peers' waiting in the gradient sync.
    assert np.allclose(straggler[1][:2], normal.step_seconds) and np.allclose(
        straggler[1][2:], normal.step_seconds + 0.3
    )
    assert np.allclose(waiting[1], straggler[1])
    assert np.allclose(waiting[2][2:] - straggler[2][2:], 0.3) and np.allclose(
        waiting[2][:2], straggler[2][:2]
    )


def test_the_time_to_flag_is_the_first_read_naming_the_straggler_after_the_onset() -> None:
    polls = Polls()
    origin, onset = 1000.0, Onset(step=20, rank=7, forward=0.3)  # at 1 step/s: 1020.0
    polls.named += [(1010.0, set(), set()), (1015.0, {3}, set()), (1025.0, {3}, set())]
    polls.named += [(1032.5, {7}, set()), (1050.0, {7}, {7})]
    flag = time_to_flag(polls, origin, 1.0, onset)
    assert flag == {"recent": 12.5, "window": 30.0, "before": 2, "false": 1}
