"""Which analysis worker keeps which job, and how many workers analyse (jobs/workers.py runs them).

A worker keeps the windows of the jobs it analysed in memory and reads only their new steps, so a
job stays with its worker: moving it costs one cold pass (its whole window read and built again,
about five times a later pass). The number of workers follows the load:

- **Base workers** (`SMON_ANALYSIS_WORKERS`, or every core but one) always analyse.
- **A spare worker** (the last core, only when SMON_ANALYSIS_WORKERS is unset) is taken when a
  pass kept a worker busy for more than `GROW_AT` of the interval: the replica is about to fall
  behind, and freshness (the time to flag) is at stake. Only while ingest leaves that core idle
  (the loop decides, jobs/loop.py `SPARE_INGEST_LOAD`, `SPARE_INGEST_KEEP`): Acks come first, and
  a replica short of both says so (its lag and ingest alerts); given back at once when ingest
  needs the core, and once the passes' work would have fit on one worker fewer within
  `SHRINK_AT` of the interval for `QUIET_PASSES` passes in a row (the gap between the two
  thresholds, and the count, keep it from coming and going). It runs at the server's priority:
  at nice +10 it got so little of its core beside the server and PostgreSQL that the 500-job
  pass took as long as with one worker (docs/storage.md).
- **Jobs move** only to even out the workers' busy time while it matters (a worker busier than
  `SHRINK_AT` of the interval, the least busy more than `BALANCED` below it), from the busiest
  worker to the least busy, and only as many a pass as their cold passes fit in `MOVE_BUDGET`
  of the interval: while they move, a pass costs about what it did without the spare.

Busy time is what the worker measured itself for each job (reads, engine, views): a 4,096-rank
job weighs what it costs, not one job's worth; a job that has not been analysed for
`RECENT_PASSES` passes (finished, idle, or failing every time) weighs nothing. Pure
bookkeeping, tested on its own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

# A job attempt: (job id, attempt).
JobKey = tuple[str, int]

GROW_AT = 0.8
SHRINK_AT = 0.5
MOVE_BUDGET = 0.5
# A moved job's first pass on its new worker, against a later pass: 64 ranks × 500 steps, cold
# ~109 ms against ~24 ms one day, ~194 against ~41 another (docs/storage.md).
COLD_FACTOR = 5.0
# Workers whose loads differ by less than this share of the busiest are even: without it, the
# jobs' costs varying by a few per cent from pass to pass moved a job or two every pass.
BALANCED = 0.1
QUIET_PASSES = 6
RECENT_PASSES = 3


@dataclass
class Change:
    """What `WorkerShares.adapt` decided after a pass."""

    grown: bool = False  # a spare worker taken
    retired: int | None = None  # the slot given back (its process may end)
    moved: dict[int, list[JobKey]] = field(default_factory=dict)  # old slot -> jobs that left it


class WorkerShares:
    def __init__(self, base: int, spare: int = 0) -> None:
        self.base = max(1, base)
        self.slots = self.base + max(0, spare)
        self.active = self.base
        self.owner: dict[JobKey, int] = {}  # job attempt -> its slot
        self.cost: dict[JobKey, float] = {}  # job attempt -> seconds its last analysis took
        self.busy: defaultdict[int, float] = defaultdict(float)  # slot -> seconds this pass
        self.passes = 0  # adapt calls so far
        self.last_ran: dict[JobKey, int] = {}  # job attempt -> the pass it was last analysed in
        self.quiet = 0  # passes in a row that would have fit on one worker fewer
        self.moved: set[JobKey] = set()  # moved to another worker, not analysed there yet

    def slot(self, job: JobKey) -> int:
        """The job's worker slot; a job seen for the first time goes to the least loaded. A job
        counts as run when placed: one whose analyses all fail ages out like an idle one."""
        slot = self.owner.get(job)
        if slot is None:
            loads = self.loads()
            slot = self.owner[job] = loads.index(min(loads))
            self.last_ran.setdefault(job, self.passes)
        return slot

    def ran(self, job: JobKey, slot: int, seconds: float) -> None:
        """A job's analysis took `seconds` on its worker."""
        if job in self.moved:
            self.moved.discard(job)  # its cold pass on the new worker: not what it costs from now
        else:
            self.cost[job] = seconds
        self.last_ran[job] = self.passes
        self.busy[slot] += seconds

    def loads(self) -> list[float]:
        """Seconds of analysis each active slot's recently analysed jobs took at their last pass (a
        job not yet analysed counts as the mean of those that were)."""
        known = [c for c in self.cost.values() if c > 0]
        unknown = sum(known) / len(known) if known else 1.0
        loads = [0.0] * self.active
        for job, slot in self.owner.items():
            if slot < self.active and self._recent(job):
                loads[slot] += self.cost.get(job, unknown)
        return loads

    def _recent(self, job: JobKey) -> bool:
        ran = self.last_ran.get(job)
        return ran is None or ran >= self.passes - RECENT_PASSES

    def forget(self, kept: set[JobKey]) -> None:
        """Only the job attempts in `kept` are still stored (a given-back worker's jobs, unplaced
        until they run again, included)."""
        for job in (set(self.owner) | set(self.cost) | set(self.last_ran) | self.moved) - kept:
            self.owner.pop(job, None)
            self.cost.pop(job, None)
            self.last_ran.pop(job, None)
            self.moved.discard(job)

    def adapt(self, interval: float, *, spare_ok: bool = True) -> Change:
        """After a pass: take or give back a spare worker (`spare_ok` false: its core is wanted
        elsewhere, so none is taken and a taken one goes at once), and move jobs between workers."""
        busy = [self.busy.get(s, 0.0) for s in range(self.active)]
        self.busy.clear()
        self.passes += 1
        change = Change()
        fits_fewer = self.active > self.base and sum(busy) / (self.active - 1) < SHRINK_AT * interval
        self.quiet = self.quiet + 1 if fits_fewer else 0
        if spare_ok and self.active < self.slots and max(busy, default=0.0) > GROW_AT * interval:
            self.active += 1
            change.grown = True
        elif self.active > self.base and (self.quiet >= QUIET_PASSES or not spare_ok):
            self.quiet = 0
            self.active -= 1
            change.retired = self.active
            for job, slot in list(self.owner.items()):
                if slot == self.active:
                    del self.owner[job]  # goes to the least loaded at its next pass
                    self.moved.add(job)
                    change.moved.setdefault(slot, []).append(job)
            return change
        self._even_out(interval, change)
        return change

    def _even_out(self, interval: float, change: Change) -> None:
        loads = self.loads()
        if self.active < 2 or max(loads) <= SHRINK_AT * interval:
            return
        budget = MOVE_BUDGET * interval
        by_slot: dict[int, list[JobKey]] = defaultdict(list)
        for job, slot in self.owner.items():
            if slot < self.active:
                by_slot[slot].append(job)
        while True:
            heavy = loads.index(max(loads))
            light = loads.index(min(loads))
            if loads[heavy] - loads[light] <= BALANCED * loads[heavy]:
                return  # even enough: what the jobs cost moves a little from pass to pass
            # The cheapest job that narrows the gap: many small moves spread the cold passes.
            movable = [
                j
                for j in by_slot[heavy]
                if j not in self.moved
                and self._recent(j)
                and 0 < self.cost.get(j, 0.0) * COLD_FACTOR <= budget
            ]
            if not movable:
                return
            job = min(movable, key=lambda j: self.cost[j])
            cost = self.cost[job]
            if loads[heavy] - cost < loads[light] + cost:
                return  # moving it would only swap which worker is busiest
            by_slot[heavy].remove(job)
            by_slot[light].append(job)
            self.owner[job] = light
            self.moved.add(job)
            loads[heavy] -= cost
            loads[light] += cost
            budget -= cost * COLD_FACTOR
            change.moved.setdefault(heavy, []).append(job)
