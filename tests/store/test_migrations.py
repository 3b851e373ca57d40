"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import json

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from smon_server.store import migrate
from smon_server.store.db import Database
from smon_server.store.models import Base


def test_upgrade_reaches_head_and_matches_models(db: Database) -> None:
    assert migrate.current_revision(db) is not None
    with db.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_upgrade_is_idempotent(db: Database) -> None:
    before = migrate.current_revision(db)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == before


def test_0003_moves_stored_results_into_their_columns(database_url: str) -> None:
    """A result stored before 0003 (one JSON blob) reads the same after it."""
    import json

    import sqlalchemy as sa

    from smon_server.store import grids

    db = Database(database_url)
    try:
        migrate.upgrade(db, "0002")
        old = {
            "state": "finished",
            "computed_at": 5.0,
            "window_start": 1.0,
            "window_end": 4.0,
            "summary": {
                "slowdown": 1.3,
                "stragglers": [{"rank": 3}],
                "diagnoses": [{"cause": "slow_worker"}],
            },
            "steps": [{"step": 7, "step_time": 1.3, "ideal_time": 1.0, "slowdown": 1.3}],
            "workers": {"dp_ranks": [0], "stages": [0], "values": [[1.3]]},
            "rank_overall": {"3": 1.3},
            "rank_slowdown": {"ranks": [1, 3], "steps": [7], "values": [[None], [1.3]]},
        }
        with db.engine.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO analysis_results (job_id, computed_at, steps_seen, slowdown, result) "
                    "VALUES ('j', 5.0, 1, 1.3, :r)"
                ),
                {"r": json.dumps(old)},
            )
        migrate.upgrade(db)
        with db.engine.connect() as c:
            row = c.execute(sa.text("SELECT * FROM analysis_results WHERE job_id = 'j'")).mappings().one()
        assert (row["state"], row["stragglers"], row["worst_rank"], row["leading_cause"]) == (
            "finished",
            1,
            3,
            "slow_worker",
        )
        assert (row["window_start"], row["window_end"]) == (1.0, 4.0)

        def load(value: object) -> object:
            return json.loads(value) if isinstance(value, str) else value

        assert load(row["summary"]) == old["summary"] and load(row["steps"]) == old["steps"]
        assert load(row["workers"]) == old["workers"] and load(row["rank_overall"]) == old["rank_overall"]
        heat = grids.unpack(bytes(row["heatmap"]))
        assert heat.ranks.tolist() == [1, 3] and heat.steps.tolist() == [7]
        assert np.isnan(heat.values[0, 0]) and heat.values[1, 0] == pytest.approx(1.3)
        assert "result" not in row
    finally:
        db.dispose()


def test_0003_downgrades_and_upgrades_again(db: Database) -> None:
    import sqlalchemy as sa

    with db.engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO analysis_results (job_id, computed_at, state, steps_seen, stragglers, "
                "leading_cause, summary) VALUES ('j', 5.0, 'running', 1, 0, '', :s)"
            ),
            {"s": '{"slowdown": 1.25}'},
        )
    migrate.downgrade(db, "0002")
    assert migrate.current_revision(db) == "0002"
    migrate.upgrade(db)
    with db.engine.connect() as c:
        row = c.execute(sa.text("SELECT state, summary FROM analysis_results")).mappings().one()
    summary = row["summary"]
    assert row["state"] == "running"
    assert (json.loads(summary) if isinstance(summary, str) else summary) == {"slowdown": 1.25}
