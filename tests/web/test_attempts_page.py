"""The job page of a job restarted under its id, in a real browser: it shows the newest attempt, says
so, and lets the reader pick an older one, with the choice in the URL (a pasted link restores it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from smon_server.runtime import BackgroundServer
from tests.api.test_attempts import SLOW_RANK, STEPS, analyse, goodbye, push
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.web.conftest import screenshot

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def restarted(postgres_admin_url: str) -> Iterator[tuple[BackgroundServer, str]]:
    """A server on PostgreSQL holding one job with two attempts: a straggler in the first only."""
    from tests.support.databases import fresh_database

    with (
        fresh_database(postgres_admin_url, "smon_web_attempts") as url,
        BackgroundServer(server_settings(url, analysis_interval=3600)) as server,
    ):
        job = f.new_job_id("team/restarted")
        now = time.time()
        push(server, job, "run1", range(STEPS), origin=now - 120, slow_rank=SLOW_RANK)
        goodbye(server, job, "run1", seq=2)
        push(server, job, "run2", range(STEPS), origin=now - 60)
        analyse(server)
        yield server, job


def query(page: Any) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def test_the_newest_attempt_is_shown_and_an_older_one_can_be_picked(
    restarted: tuple[BackgroundServer, str], page: Any, browser: Any
) -> None:
    server, job = restarted
    page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}")
    page.get_by_test_id("headline").wait_for(timeout=30_000)
    picker = page.get_by_test_id("attempt")
    picker.wait_for()
    assert picker.input_value() == "2"
    assert [o.get_attribute("value") for o in picker.locator("option").all()] == ["2", "1"]
    assert "(latest)" in picker.locator("option").first.inner_text()
    assert page.get_by_test_id("stragglers").count() == 0  # the newest run is clean
    assert page.get_by_test_id("attempt-note").count() == 0
    screenshot(page, "job-attempt-latest")

    picker.select_option("1")
    page.get_by_test_id("stragglers").wait_for(timeout=30_000)
    assert query(page)["attempt"] == ["1"]
    assert "Attempt 1 of 2" in page.get_by_test_id("attempt-note").inner_text()
    row = page.locator("[data-testid=stragglers] tbody tr").first
    assert row.get_attribute("data-rank") == str(SLOW_RANK)
    screenshot(page, "job-attempt-1")

    # The link, pasted into a fresh session, shows the same attempt.
    other = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        pasted = other.new_page()
        pasted.goto(page.url)
        pasted.get_by_test_id("stragglers").wait_for(timeout=30_000)
        assert pasted.get_by_test_id("attempt").input_value() == "1"
    finally:
        other.close()

    # A straggler's worker page stays in that attempt.
    row.locator("a").first.click()
    page.get_by_test_id("worker-attempt").wait_for(timeout=30_000)
    assert urlsplit(page.url).path.endswith(f"/workers/{SLOW_RANK}") and query(page)["attempt"] == ["1"]
    assert "attempt 1 of 2" in page.get_by_test_id("worker-attempt").inner_text()
    page.go_back()

    page.get_by_test_id("attempt-note").get_by_role("link").click()
    page.get_by_test_id("headline").wait_for(timeout=30_000)
    page.wait_for_function("() => !location.search.includes('attempt=')")
    assert page.get_by_test_id("attempt").input_value() == "2"
    assert not [e for e in page.errors if "Failed to load resource" not in e], page.errors


def test_a_busy_or_slow_window_says_so_not_that_the_database_is_down(
    restarted: tuple[BackgroundServer, str], page: Any
) -> None:
    """The server answers a zoomed window 503 when it analyses as many windows as it runs at once,
    and 504 past SMON_WINDOW_ANALYSIS_TIMEOUT (jobs/windows.py): the banner gives its words, not
    the database outage a 503 of api/main.py means."""
    server, job = restarted
    answers = {
        503: "2 analyses of other step windows are running, the most one server runs at once; retry",
        504: "the analysis of this step window took longer than SMON_WINDOW_ANALYSIS_TIMEOUT (30 s)",
    }
    for status, detail in answers.items():
        reply = {"status": status, "json": {"detail": detail}, "headers": {"Retry-After": "5"}}
        page.route("**/heatmap?*", lambda route, request, reply=reply: route.fulfill(**reply))
        page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}?from_step=5&to_step=20")
        banner = page.get_by_role("alert").filter(has_text="the heatmap")
        banner.wait_for(timeout=30_000)
        text = banner.inner_text()
        assert detail in text and "database" not in text, text
        assert "retries on its own" in text
        page.unroute("**/heatmap?*")
