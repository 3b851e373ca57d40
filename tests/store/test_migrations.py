"""The Alembic migrations build exactly the schema the models describe, on both databases."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from smon_server.store import migrate, queries, step_series
from smon_server.store.db import Database
from smon_server.store.models import Base
from smon_server.store.partitions import alembic_include_name


def test_upgrade_reaches_head_and_matches_models(db: Database) -> None:
    assert migrate.current_revision(db) is not None
    with db.engine.connect() as connection:
        # Day partitions are made at run time (store/partitions.py), as migrations/env.py says.
        context = MigrationContext.configure(connection, opts={"include_name": alembic_include_name})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models and migrations differ; add a migration: {diff}"


def test_upgrade_is_idempotent(db: Database) -> None:
    before = migrate.current_revision(db)
    migrate.upgrade(db)
    assert migrate.current_revision(db) == before


def test_0003_moves_stored_results_into_their_columns(empty_database_url: str) -> None:
    """A result stored before 0003 (one JSON blob) reads the same after it."""
    import json

    import sqlalchemy as sa

    from smon_server.store import grids

    db = Database(empty_database_url)
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

        assert load(row["summary"]) == old["summary"]
        assert step_series.unpack(bytes(row["steps"])).rows() == old["steps"]  # packed by 0014
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
                "INSERT INTO analysis_results (job_id, attempt, computed_at, state, steps_seen, stragglers, "
                "leading_cause, summary) VALUES ('j', 1, 5.0, 'running', 1, 0, '', :s)"
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


def test_0014_packs_stored_step_series_and_unpacks_them_on_downgrade(empty_database_url: str) -> None:
    """A series stored as JSON rows before 0014 reads the same packed after it, nulls kept; a
    downgrade gives the rows back."""
    import sqlalchemy as sa

    rows = [
        {"step": 7, "step_time": 1.3, "ideal_time": 1.0, "slowdown": 1.3},
        {"step": 9, "step_time": 0.25, "ideal_time": 0.5, "slowdown": None},
    ]
    db = Database(empty_database_url)
    try:
        migrate.upgrade(db, "0013_step_writes")
        with db.engine.begin() as c:
            for job, steps in (("j", rows), ("empty", []), ("none", None)):
                c.execute(
                    sa.text(
                        "INSERT INTO analysis_results (job_id, attempt, computed_at, state, steps_seen, "
                        "stragglers, leading_cause, steps) VALUES (:j, 1, 5.0, 'running', 2, 0, '', :s)"
                    ),
                    {"j": job, "s": None if steps is None else json.dumps(steps)},
                )
        migrate.upgrade(db)

        def stored() -> dict[str, Any]:
            with db.engine.connect() as c:
                return dict(c.execute(sa.text("SELECT job_id, steps FROM analysis_results")).all())

        packed = stored()
        series = step_series.unpack(bytes(packed["j"]))
        assert series.steps.tolist() == [7, 9] and np.isnan(series.slowdown[1])
        assert series.rows() == rows
        assert len(step_series.unpack(bytes(packed["empty"]))) == 0
        assert len(step_series.unpack(bytes(packed["none"]))) == 0
        migrate.downgrade(db, "0013_step_writes")
        back = {k: json.loads(v) if isinstance(v, str) else v for k, v in stored().items()}
        assert back == {"j": rows, "empty": [], "none": []}
    finally:
        db.dispose()


def _old_step(job: str, agent: str, rank: int, step: int, spans: list, phases: dict, **extra: object) -> dict:
    row = {
        "job_id": job,
        "rank": rank,
        "step": step,
        "agent_id": agent,
        "dp_rank": rank,
        "pp_rank": 0,
        "tp_rank": 0,
        "start_time": 1000.0 + step,
        "end_time": 1000.5 + step,
        "duration": 0.5,
        "phases": json.dumps(phases),
        "spans": json.dumps(spans),
        "gc_count": 0,
        "gc_seconds": 0.0,
        "seq_count": 0,
        "seq_tokens": 0,
        "seq_sum_sq": 0.0,
        "seq_max_len": 0,
        "microbatch_seq": "[]",
        "received_at": 1001.0 + step,
    }
    return row | extra


def test_0005_packs_stored_step_records_and_downgrades_them_back(empty_database_url: str) -> None:
    """Records stored as JSON before 0005 read the same from the packed layout, phase-only
    records get their phases as spans, and a downgrade gives the JSON back."""
    import sqlalchemy as sa

    from smon_server.store.models import Job
    from smon_server.store.step_window import read_window

    db = Database(empty_database_url)
    try:
        migrate.upgrade(db, "0004")
        spans = [["forward", 0.01, 0.2, 0, 0], ["gc", 0.05, 0.03, -1, 0], ["backward", 0.25, 0.2, 1, 2]]
        rows = [
            _old_step(
                "j",
                "a0",
                0,
                7,
                spans,
                {"forward": 0.2, "gc": 0.03, "backward": 0.2},
                gc_count=2,
                gc_seconds=0.04,
            ),
            _old_step(
                "j",
                "a1",
                1,
                7,
                [],
                {"forward": 0.1, "other": 0.3, "backward": 0.1},
                seq_count=2,
                seq_tokens=30,
                seq_sum_sq=500.0,
                seq_max_len=20,
                microbatch_seq=json.dumps([[0, 1, 10, 100.0, 10], [1, 1, 20, 400.0, 20]]),
            ),
        ]
        with db.engine.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO jobs (job_id, world_size, dp_size, pp_size, tp_size, first_seen, last_seen, "
                    "gpu_hours_wasted) VALUES ('j', 2, 2, 1, 1, 1.0, 2.0, 0.0)"
                )
            )
            for agent, rank in (("a0", 0), ("a1", 1)):
                c.execute(
                    sa.text(
                        "INSERT INTO agents (agent_id, job_id, rank, local_rank, host, gpu_uuid, dp_rank, "
                        "pp_rank, tp_rank, pid, agent_version, backend, clock_offset, first_seen, last_seen, "
                        "dropped_records, errors, final, hb_phase) VALUES (:a, 'j', :r, 0, 'h', '', :r, "
                        "0, 0, 1, '', '', 0.0, 1.0, 2.0, 0, 0, false, '')"
                    ),
                    {"a": agent, "r": rank},
                )
            columns = ", ".join(rows[0])
            values = ", ".join(f":{k}" for k in rows[0])
            c.execute(sa.text(f"INSERT INTO step_records ({columns}) VALUES ({values})"), rows)
        migrate.upgrade(db)
        with db.session() as session:
            job = session.get(Job, ("j", 1))
            assert job is not None
            cols = read_window(session=session, job=job, from_step=None, to_step=None)
        assert list(cols.rank) == [0, 1] and list(cols.dp_rank) == [0, 1]
        names = [cols.kinds[k] for k in cols.span_kind]
        assert names == ["forward", "gc", "backward", "forward", "backward"]
        np.testing.assert_allclose(cols.span_start, [0.01, 0.05, 0.25, 0.0, 0.1], rtol=1e-6)
        phases = cols.phase_table()
        assert phases["forward"][0] == pytest.approx(0.2) and phases["gc"][0] == pytest.approx(0.04)
        assert phases["other"][1] == pytest.approx(0.3)
        assert cols.seq_sum_sq[1] == 500.0 and list(cols.mb_sum_sq) == [100.0, 400.0]

        migrate.downgrade(db, "0004")
        with db.engine.connect() as c:
            back = c.execute(sa.text("SELECT * FROM step_records ORDER BY rank")).mappings().all()
        load = lambda v: json.loads(v) if isinstance(v, str) else v  # noqa: E731
        assert [s[0] for s in load(back[0]["spans"])] == ["forward", "gc", "backward"]
        assert load(back[0]["spans"])[2][3:] == [1, 2]
        assert load(back[1]["microbatch_seq"]) == [[0, 1, 10, 100.0, 10], [1, 1, 20, 400.0, 20]]
        assert back[1]["seq_sum_sq"] == 500.0 and back[0]["agent_id"] == "a0"
        migrate.upgrade(db)
    finally:
        db.dispose()


def test_0009_makes_stored_jobs_attempt_1_and_its_downgrade_keeps_the_newest(empty_database_url: str) -> None:
    """Jobs stored before 0009 become attempt 1 of themselves, with everything keyed by them; a
    second attempt can then be stored beside the first; the downgrade keeps each job's newest."""
    import sqlalchemy as sa

    db = Database(empty_database_url)
    try:
        migrate.upgrade(db, "0008")
        with db.engine.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO jobs (job_id, key, world_size, dp_size, pp_size, tp_size, first_seen, "
                    "last_seen, last_step, gpu_hours_wasted) VALUES ('j', 7, 2, 2, 1, 1, 1.0, 2.0, 5, 0.5)"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO agents (agent_id, key, job_id, rank, local_rank, host, gpu_uuid, dp_rank, "
                    "pp_rank, tp_rank, pid, agent_version, backend, clock_offset, first_seen, last_seen, "
                    "dropped_records, errors, final, hb_phase) VALUES ('a0', 3, 'j', 0, 0, 'h', '', 0, 0, 0, "
                    "1, '', '', 0.0, 1.0, 2.0, 0, 0, false, '')"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO analysis_results (job_id, computed_at, state, steps_seen, stragglers, "
                    "leading_cause, flagged) VALUES ('j', 5.0, 'finished', 1, 0, '', false)"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO job_trend (job_id, bucket, first_step, last_step, step_times, ideal_times, "
                    "stragglers, leading_cause, computed_at) VALUES ('j', 0, 0, 5, :b, :b, '[]', '', 5.0)"
                ),
                {"b": b"\x00" * 200},
            )
            c.execute(
                sa.text(
                    "INSERT INTO step_records (job_key, step, rank, start_time, duration, agent_key, "
                    "gc_count, gc_seconds, spans) VALUES (7, 5, 0, 1.5, 0.1, 3, 0, 0.0, :s)"
                ),
                {"s": b""},
            )
        migrate.upgrade(db)
        with db.engine.begin() as c:
            for table in ("jobs", "agents", "analysis_results", "job_trend"):
                assert c.execute(sa.text(f"SELECT attempt FROM {table}")).scalars().all() == [1], table
            # A second attempt of the same job id is a row of its own, with its own key and rows.
            c.execute(
                sa.text(
                    "INSERT INTO jobs (job_id, attempt, key, world_size, dp_size, pp_size, tp_size, "
                    "first_seen, last_seen, gpu_hours_wasted) VALUES ('j', 2, 8, 2, 2, 1, 1, 3.0, 4.0, 0.0)"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO analysis_results (job_id, attempt, computed_at, state, steps_seen, "
                    "stragglers, leading_cause, flagged) VALUES ('j', 2, 5.0, 'running', 1, 0, '', false)"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO step_records (job_key, step, rank, start_time, duration, agent_key, "
                    "gc_count, gc_seconds, spans) VALUES (8, 5, 0, 3.5, 0.1, 4, 0, 0.0, :s)"
                ),
                {"s": b""},
            )
        with db.session() as session:
            newest = queries.get_job(session=session, job_id="j")
            assert newest is not None and (newest.attempt, newest.key) == (2, 8)
        migrate.downgrade(db, "0008")
        with db.engine.connect() as c:
            assert c.execute(sa.text("SELECT key FROM jobs")).scalars().all() == [8]
            assert c.execute(sa.text("SELECT job_key FROM step_records")).scalars().all() == [8]
            assert c.execute(sa.text("SELECT state FROM analysis_results")).scalars().all() == ["running"]
            assert c.execute(sa.text("SELECT count(*) FROM agents")).scalar() == 0  # attempt 1's
            assert c.execute(sa.text("SELECT count(*) FROM job_trend")).scalar() == 0
        migrate.upgrade(db)
        assert migrate.current_revision(db) is not None
    finally:
        db.dispose()


def test_0010_gives_each_job_the_names_its_records_use_and_downgrades_to_one_dictionary(
    empty_database_url: str,
) -> None:
    """Records stored under the one global dictionary read the same names after 0010, each job
    holding only the names it uses; a job stored after it (codes of its own, clashing with the
    first's) reads the same names after a downgrade, which renumbers and rewrites its spans."""
    import sqlalchemy as sa

    from smon_server.ingest.validate import Limits, validate_batch
    from smon_server.store import codec
    from smon_server.store.models import Job
    from smon_server.store.step_window import read_window
    from smon_server.store.writes import write_batches
    from tests.support import factories as f
    from tests.support.stored import pack_spans

    db = Database(empty_database_url)
    try:
        migrate.upgrade(db, "0009")
        with db.engine.begin() as c:
            c.execute(
                sa.text(
                    "INSERT INTO span_kinds (code, name)"
                    " VALUES (1, 'forward'), (2, 'backward'), (3, 'unused'), (4, 'eval')"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO jobs (job_id, attempt, key, world_size, dp_size, pp_size, tp_size,"
                    " first_seen, last_seen, last_step, gpu_hours_wasted)"
                    " VALUES ('old', 1, 7, 1, 1, 1, 1, 1.0, 2.0, 3, 0)"
                )
            )
            c.execute(
                sa.text(
                    "INSERT INTO agents (agent_id, key, job_id, attempt, rank, local_rank, host, gpu_uuid,"
                    " dp_rank, pp_rank, tp_rank, pid, agent_version, backend, clock_offset, first_seen,"
                    " last_seen, dropped_records, errors, final, hb_phase) VALUES ('a0', 3, 'old', 1, 0, 0,"
                    " 'h', '', 0, 0, 0, 1, '', '', 0.0, 1.0, 2.0, 0, 0, false, '')"
                )
            )
            spans = pack_spans([(1, 0.0, 0.1, -1, 0), (2, 0.1, 0.2, -1, 0)])
            c.execute(
                sa.text(
                    "INSERT INTO step_records (job_key, step, rank, start_time, duration, agent_key,"
                    " gc_count, gc_seconds, spans) VALUES (7, 3, 0, :t, 0.3, 3, 0, 0.0, :s)"
                ),
                {"t": f.T0, "s": spans},
            )
            c.execute(
                sa.text(
                    "INSERT INTO phase_columns (job_key, metric, step, seconds) VALUES (7, 4, 3, :v)"
                ),  # a phase heatmap of `eval` outliving its records
                {"v": b"\x00" * 4},
            )
        migrate.upgrade(db)
        with db.engine.connect() as c:
            held = c.execute(sa.text("SELECT job_key, code, name FROM job_span_kinds ORDER BY code")).all()
        assert [tuple(r) for r in held] == [(7, 1, "forward"), (7, 2, "backward"), (7, 4, "eval")]

        def names(job_id: str) -> list[str]:
            with db.session() as session:
                job = session.get(Job, (job_id, 1))
                assert job is not None
                cols = read_window(session=session, job=job, from_step=None, to_step=None)
            return [cols.kinds[k] for k in cols.span_kind]

        assert names("old") == ["forward", "backward"]
        step = f.dp_step(0, start=f.T0)  # data_wait, forward, backward, grad_sync, optimizer: codes 1..5
        write_batches(db, [validate_batch(f.batch("new", 0, 1, steps=[step]), Limits())], now=f.T0)
        before = names("new")
        assert sorted(before) == ["backward", "data_wait", "forward", "grad_sync", "optimizer"]
        db.dispose()  # the process caches codes: a downgrade is made with no server running

        migrate.downgrade(db, "0009")
        with db.engine.connect() as c:
            glob: dict[int, str] = {
                int(k): str(n) for k, n in c.execute(sa.text("SELECT code, name FROM span_kinds"))
            }
            stored = {
                key: [glob[int(k)] for k in codec.unpack_spans(bytes(blob))["kind"]]
                for key, blob in c.execute(sa.text("SELECT job_key, spans FROM step_records")).all()
            }
            metric = c.execute(sa.text("SELECT metric FROM phase_columns WHERE job_key = 7")).scalar_one()
        assert len(set(glob.values())) == len(glob) == 6  # one code per name
        assert stored[7] == ["forward", "backward"] and glob[metric] == "eval"
        new_key = next(k for k in stored if k != 7)
        assert stored[new_key] == before
        migrate.upgrade(db)
        assert names("new") == before and names("old") == ["forward", "backward"]
    finally:
        db.dispose()
