"""Which steps a device clock times: the same steps on every rank, a few a second whatever the step.

A CUDA event is cheap on the host (a pooled one: ~2 µs) but not free on a launch-bound stream,
where every event is one more thing the device must reach in order. So on a GPU the agent times
*some* steps on the device, every boundary of them (the phase times the analysis needs are device
truth), and records nothing at all for the others. NVIDIA's straggler detector does the same with
its `profiling_interval`.

- Steps are timed in blocks of `BLOCK` consecutive steps: the server re-cuts steps at their last
  collective (the first step of a run only lends its tail to the next), so a lone step would be
  lost to the analysis; a block of four gives it three.
- A block is timed when a hash of its number is divisible by the period: every rank picks the same
  blocks with no exchange, and no periodic work in the job (an evaluation every 20 steps) can
  alias with the choice the way "every N-th step" can.
- The period is a power of two, so blocks timed at period 2P are a subset of those at P: ranks
  that disagree for a moment (each measures its own step time) still share the coarser set, which
  is what the server analyses (steps every worker reported).
- `auto` picks the period from the step time so that device timing costs about `BUDGET` of the
  training time on average (`SAMPLED_STEP_COST` per timed step, measured on an H200, docs/agent.md):
  about 10 timed steps a second on short steps, every step from ~100 ms up. A fixed period (1 =
  every step) is `SMON_AGENT_DEVICE_SAMPLING=N`.
"""

from __future__ import annotations

BLOCK = 4
# What one device-timed step costs the job beyond an untimed one (events recorded, the stream
# looked up, the read-back), and the share of training time device timing may take on average.
SAMPLED_STEP_COST = 2e-4
BUDGET = 2e-3
MAX_PERIOD = 64
# The step times the automatic period follows (their median), and how often it looks (steps).
WINDOW = 32
DECIDE_EVERY = 8
_MASK = (1 << 64) - 1


def block_hash(block: int) -> int:
    """A well-mixed 64-bit hash of a block number (splitmix64's finaliser)."""
    z = (block * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def period_for(step_seconds: float) -> int:
    """The power-of-two period that keeps device timing near BUDGET of a step this long."""
    if step_seconds <= 0:
        return MAX_PERIOD
    want = SAMPLED_STEP_COST / (BUDGET * step_seconds)
    period = 1
    while period < want and period < MAX_PERIOD:
        period *= 2
    return period


class DeviceSampling:
    """The step schedule of a device clock (training thread only; a few integer ops a step)."""

    def __init__(self, period: int | None = None) -> None:
        # None: automatic, from the step time; until that is known, every block is timed (the
        # first steps are warm-up on the server anyway).
        self.fixed = period is not None
        self.period = max(1, int(period)) if period is not None else 1
        self._block = -1
        self._timed = True
        self._recent: list[float] = []  # the last WINDOW host step times, a ring
        self._steps = 0

    def timed(self, step: int) -> bool:
        """Whether step `step` is device-timed (the answer is fixed per block)."""
        block = step // BLOCK
        if block != self._block:
            self._block = block
            period = self.period
            self._timed = period == 1 or block_hash(block) % period == 0
        return self._timed

    def observe(self, step_seconds: float) -> None:
        """One step's host duration. `auto` follows the *median* of the last WINDOW steps: what a
        timed step costs is set against the typical step, so an evaluation, a checkpoint or a pause
        between steps (a mean would take a 2 s pause every 20 steps of 6 ms for a 100 ms step, and
        time every step) does not move it. The period moves only when the median is 20% clear of
        the boundary between two periods, so that ranks near one do not flip."""
        if self.fixed or step_seconds <= 0:
            return
        recent = self._recent
        if len(recent) < WINDOW:
            recent.append(step_seconds)
        else:
            recent[self._steps % WINDOW] = step_seconds
        self._steps += 1
        if self._steps % DECIDE_EVERY:
            return
        typical = sorted(recent)[len(recent) // 2]
        want = period_for(typical)
        if want == self.period:
            return
        # Keep the period while it is one the median's ±20% band maps to; else take the median's.
        if not period_for(typical * 1.2) <= self.period <= period_for(typical * 0.8):
            self.period = want
