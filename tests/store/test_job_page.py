"""The jobs list filters, counts and pages in SQL, with the same live state as the Python rule."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from smon_server.jobs.liveness import job_state
from smon_server.store import queries
from smon_server.store.db import Database
from smon_server.store.models import AnalysisResult
from tests.support.factories import stored_job

STALL = 120.0


def add_job(
    s: Session,
    job_id: str,
    now: float,
    *,
    step_ago: float | None,
    agents: list[tuple[int, float, float, bool]],
    slowdown: float | None = None,
    seen_ago: float = 1.0,
) -> None:
    """agents: (rank, first_seen ago, last_seen ago, final)."""
    stored_job(s, job_id, now, seen_ago=seen_ago, step_ago=step_ago, agents=[(*a, 0) for a in agents])
    if slowdown is not None:
        s.add(AnalysisResult(job_id=job_id, computed_at=now, state="", slowdown=slowdown, steps_seen=1))


def test_sql_state_matches_the_python_rule_and_filters_page(db: Database) -> None:
    now = time.time()
    with db.transaction() as s:
        add_job(s, "running", now, step_ago=1, agents=[(0, 500, 1, False), (1, 500, 1, False)], slowdown=1.5)
        add_job(s, "stalled", now, step_ago=500, agents=[(0, 900, 1, False), (1, 900, 2, False)], seen_ago=2)
        add_job(
            s,
            "said-bye",
            now,
            step_ago=1,
            agents=[(0, 500, 1, True), (1, 500, 1, True)],
            slowdown=1.0,
            seen_ago=3,
        )
        add_job(s, "silent", now, step_ago=600, agents=[(0, 900, 600, False)], seen_ago=600)
        # rank 1 restarted: its old agent never said goodbye, the new one did
        add_job(
            s,
            "restarted",
            now,
            step_ago=1,
            agents=[(0, 500, 1, True), (1, 900, 400, False), (1, 300, 1, True)],
            seen_ago=4,
        )
        add_job(s, "no-agents", now, step_ago=None, agents=[], seen_ago=5)
    with db.session() as s:
        page, total = queries.job_page(session=s, now=now, stall_seconds=STALL)
        states = {r.job.job_id: r.live_state for r in page}
        for row in page:
            all_final, heard = queries.liveness_facts(session=s, job=row.job)
            expected = job_state(row.job, all_final=all_final, last_heard=heard, now=now, stall_seconds=STALL)
            assert row.live_state == expected.value, row.job.job_id
        assert total == 6
        assert states == {
            "running": "running",
            "stalled": "stalled",
            "said-bye": "finished",
            "silent": "finished",
            "restarted": "finished",
            "no-agents": "stalled",  # heard from, but no step for longer than the stall time
        }
        assert [r.job.job_id for r in page] == [
            "running",
            "stalled",
            "said-bye",
            "restarted",
            "no-agents",
            "silent",
        ]

        finished, n = queries.job_page(session=s, now=now, stall_seconds=STALL, state="finished", limit=2)
        assert n == 3 and [r.job.job_id for r in finished] == ["said-bye", "restarted"]
        rest, n = queries.job_page(
            session=s, now=now, stall_seconds=STALL, state="finished", limit=2, offset=2
        )
        assert n == 3 and [r.job.job_id for r in rest] == ["silent"]
        past, n = queries.job_page(session=s, now=now, stall_seconds=STALL, offset=50)
        assert past == [] and n == 6
        slow, n = queries.job_page(session=s, now=now, stall_seconds=STALL, slowdown_at_least=1.1)
        assert [r.job.job_id for r in slow] == ["running"] and n == 1 and slow[0].result is not None
        calm, n = queries.job_page(session=s, now=now, stall_seconds=STALL, slowdown_below=1.1)
        assert n == 5 and "running" not in [r.job.job_id for r in calm]
        found, n = queries.job_page(session=s, now=now, stall_seconds=STALL, contains="start")
        assert [r.job.job_id for r in found] == ["restarted"] and n == 1
        assert queries.job_page(session=s, now=now, stall_seconds=STALL, contains="_")[1] == 0
