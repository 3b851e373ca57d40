"""The default analysis window's bounds found past the last pass's window (store/queries.py
`newest_window` with `known`) equal those found by hopping over every step again, whatever steps
arrive: in order, with gaps, late inside an old gap, or fewer than the window holds."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from smon_server.store import queries
from smon_server.store.db import Database
from smon_server.store.models import Job
from tests.support import factories as f
from tests.support.stored import store_batches

LAST = 12


def store_steps(db: Database, job: str, steps: list[int], seq: int) -> None:
    """One rank's records of `steps` (a step's number is all this reads)."""
    records = [rec for s in steps for rec in f.dp_job_steps(1, [s], origin=f.T0 + s)[0]]
    store_batches(db, [f.batch(job, 0, 1, seq=seq, steps=records)], now=f.T0 + 10_000)


def bounds(db: Database, job_id: str, known: tuple[int, int] | None) -> tuple[int | None, int | None, bool]:
    with db.session() as session:
        job = session.scalars(select(Job).where(Job.job_id == job_id)).one()
        return queries.newest_window(session=session, job=job, last=LAST, known=known)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_known_window_gives_the_bounds_a_full_hop_gives(db: Database, seed: int) -> None:
    rng = np.random.default_rng(seed)
    job = f.new_job_id("newest")
    top, known, shortcuts = 0, None, 0
    for seq in range(1, 26):
        # Mostly the next steps in order; sometimes a gap, sometimes a step late inside an old gap.
        count = int(rng.integers(1, 8))
        gap = int(rng.integers(2, 6)) if rng.random() < 0.25 else 0
        steps = list(range(top + 1 + gap, top + 1 + gap + count))
        if rng.random() < 0.2 and top > 3:
            steps.append(int(rng.integers(0, top)))
        top = max(top, *steps)
        store_steps(db, job, steps, seq)
        full = bounds(db, job, None)
        shortcut = bounds(db, job, known)
        assert shortcut == full, (steps, known)
        shortcuts += known is not None
        lo, hi, contiguous = full
        known = (lo, hi) if contiguous and lo is not None and hi is not None else None
    assert shortcuts > 5  # the known window was used, not just the fallback


def test_contiguity_is_what_the_steps_say(db: Database) -> None:
    job = f.new_job_id("newest")
    store_steps(db, job, list(range(0, 20)), 1)
    assert bounds(db, job, None) == (8, 19, True)
    store_steps(db, job, [22, 23], 2)  # 20 and 21 missing: inside the newest 12
    assert bounds(db, job, (8, 19)) == (10, 23, False) == bounds(db, job, None)
    store_steps(db, job, [20, 21], 3)  # late, filling the gap: contiguous again
    assert bounds(db, job, None) == (12, 23, True)
