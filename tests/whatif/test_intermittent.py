"""Stragglers that come and go (issue 29): a loss on some steps only, and the ranks that wait.

- `robust.beyond_noise`: a loss spread over the window stands out even when it makes the per-step
  spread as large as itself; a burst on a few steps, or plain noise, does not.
- Simulated DDP jobs (step records, the live path's input) with ordinary jitter on every rank: a
  data wait on one rank on every other step is named `data_loader` with S at the truth, and the
  ranks that only wait for rank 0's periodic evaluation carry S_w near 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from smon_server.whatif.config import WhatIfConfig
from smon_server.whatif.robust import beyond_noise, jitter_against
from tests.whatif.step_records import DdpJob
from tests.whatif.test_live_truth import _gaussian, truth_and_summary

RNG_SEED = 3


def _steps_with(loss: np.ndarray, noise_sd: float = 0.001, seed: int = RNG_SEED) -> np.ndarray:
    """[steps, 2] per-step cost: worker 0 the reference, worker 1 the same plus `loss`."""
    rng = np.random.default_rng(seed)
    base = 0.010 + rng.normal(0.0, noise_sd, size=(loss.size, 2))
    base[:, 1] += loss
    return base


def _stands_out(per_step: np.ndarray) -> bool:
    surplus = per_step[:, 1].mean() - per_step[:, 0].mean()
    return bool(beyond_noise(per_step, 0, np.array([1]), np.array([surplus]))[0])


def test_a_loss_on_every_other_step_stands_out() -> None:
    loss = np.where(np.arange(60) % 2 == 0, 0.050, 0.0)
    per_step = _steps_with(loss)
    surplus = per_step[:, 1].mean() - per_step[:, 0].mean()
    # The per-step test alone cannot tell: the pattern's own spread is as large as its mean.
    assert surplus < 2.0 * float(jitter_against(per_step, 0, np.array([1]))[0])
    assert _stands_out(per_step)


def test_a_burst_or_noise_does_not_stand_out() -> None:
    burst = np.zeros(60)
    burst[20:30] = 0.020  # a neighbour on the rank's core for 10 of 60 steps
    assert not _stands_out(_steps_with(burst, noise_sd=0.004))
    for seed in range(20):  # the same distribution on both workers
        assert not _stands_out(_steps_with(np.zeros(60), noise_sd=0.004, seed=seed))


def test_a_rare_periodic_spike_still_stands_out() -> None:
    spikes = np.where(np.arange(60) % 20 == 5, 0.200, 0.0)  # every 20 steps: per-step test
    assert _stands_out(_steps_with(spikes))


def test_short_windows_keep_the_per_step_test_alone() -> None:
    loss = np.where(np.arange(12) % 2 == 0, 0.050, 0.0)  # too few steps for 4 blocks of 5
    per_step = _steps_with(loss)
    assert not _stands_out(per_step)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("stride", [3, 7])
def test_data_wait_that_comes_and_goes_is_named_with_s_at_the_truth(ranks: int, stride: int) -> None:
    """Rank 1's loader runs dry by a different amount each step (0-80 ms on a 40 ms step), the
    others never wait: its per-step spread is as large as its mean wait, so the per-step test
    alone kept it in D* (S about half the truth's excess) and named nobody."""
    job = DdpJob(
        ranks=ranks,
        steps=60,
        jitter=_gaussian(0.001),
        extra_data=lambda r, s: 0.080 * ((s * stride) % 10) / 10 if r == 1 else 0.0,
    )
    truth, s, out, found = truth_and_summary(job)
    assert truth > 1.3
    assert s == pytest.approx(truth, rel=0.05)
    assert [(rank, cause) for rank, cause, _ in found] == [(1, "data_loader")]
    assert out["diagnoses"][0].cause == "data_loader"
    left_out = out["result"].prepared.durations.left_out
    assert left_out.get("data_wait") == [(1, 0)]


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_waiting_for_periodic_work_carry_s_w_near_one(ranks: int) -> None:
    """Rank 0 evaluates for 150 ms every 10 steps; every rank jitters (sd 4 ms on a 40 ms step).
    Against the jitter-free T(D*) a waiting rank's own jitter read as its share; against itself at
    its healthy durations it reads about 1, and only rank 0 is named."""
    job = DdpJob(
        ranks=ranks,
        steps=80,
        jitter=_gaussian(0.004),
        eval_span=lambda r, s: 0.150 if r == 0 and s % 10 == 5 else 0.0,
    )
    truth, s, out, found = truth_and_summary(job)
    result = out["result"]
    attribution = result.attribution
    assert attribution is not None
    assert truth > 1.2
    assert s == pytest.approx(truth, rel=0.05)
    assert [(rank, cause) for rank, cause, _ in found] == [(0, "host_work")]
    waiting = attribution.worker[1:, 0]
    assert waiting.max() <= 1.02, waiting
    assert attribution.worker[0, 0] >= 1.2
    # The jitter-free frame (the paper's add-back) is what blamed the waiting ranks.
    assert result.replay_slowdown > s


def test_the_papers_estimator_keeps_the_jitter_free_s_dp() -> None:
    """No jitter allowance there: each rank's add-back over the one scalar T(D*), step by step."""
    job = DdpJob(ranks=2, steps=40, jitter=_gaussian(0.004), extra_forward=lambda r, s: 0.01 if r == 1 else 0)
    _, _, out, _ = truth_and_summary(job, WhatIfConfig(estimator="paper"))
    result = out["result"]
    attribution = result.attribution
    assert attribution is not None and result.prepared is not None
    assert result.prepared.durations.jitter is None
    assert attribution.dp == pytest.approx(attribution.dp_step.mean(axis=1), rel=1e-9)
