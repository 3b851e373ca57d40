"""Step records written with binary COPY (store/copy_binary.py) read back as the rows the
message path makes (`_step_rows`), value for value, NULLs and variable-width blobs included."""

from __future__ import annotations

import random

import numpy as np
import pytest
from sqlalchemy import select

from smon_server.ingest.validate import Limits, validate_batch
from smon_server.store import migrate
from smon_server.store.db import Database
from smon_server.store.models import Agent, Job, StepRecord
from smon_server.store.writes import STEP_COLUMNS, _step_rows, write_batches
from tests.ingest.test_step_table import as_table, varied_records
from tests.support import factories as f

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("seed", range(3))
def test_binary_copy_stores_the_rows_the_message_path_makes(postgres_url: str, seed: int) -> None:
    db = Database(postgres_url)
    migrate.upgrade(db)
    rng = random.Random(seed)
    batches = []
    for rank in range(3):
        records = varied_records(25 + rank, rng)
        batch = as_table(records, seq=1) if rank % 2 else f.batch("tbl", rank, 3, steps=records)
        batch.coords.rank, batch.coords.world_size, batch.agent_id = rank, 3, f"agent-{seed}-{rank}"
        batches.append(validate_batch(batch, Limits()))
    write_batches(db, batches, now=f.T0)
    with db.session() as session:
        job_key = session.scalar(select(Job.key).where(Job.job_id == "tbl"))
        agent_keys = dict(session.execute(select(Agent.agent_id, Agent.key)).all())
        stored = {
            (row.rank, row.step): row
            for row in session.scalars(select(StepRecord).where(StepRecord.job_key == job_key))
        }
    assert job_key is not None
    codes = {job_key: db.kinds.cached(job_key, set().union(*(b.steps.kind_names for b in batches)))}
    assert codes[job_key] is not None  # every name was coded as the batches were stored
    expected = [
        dict(zip(STEP_COLUMNS, row, strict=True))
        for b in batches
        for row in _step_rows(b, codes, job_key, agent_keys[b.agent_id])  # type: ignore[arg-type]
    ]
    assert len(stored) == len(expected) == sum(len(b.steps) for b in batches)
    for want in expected:
        got = stored[(want["rank"], want["step"])]
        for column in STEP_COLUMNS:
            value = getattr(got, column)
            if column in ("duration", "gc_seconds"):  # REAL columns: the float32 nearest the value
                assert np.float32(value) == np.float32(want[column]), column
            else:
                assert value == want[column], column
    assert any(want["seq_total"] is not None for want in expected)
    assert any(want["seq_microbatches"] is not None for want in expected)
    assert any(want["seq_total"] is None for want in expected)
    db.dispose()
