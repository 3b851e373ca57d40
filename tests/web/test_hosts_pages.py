"""The fleet pages in a real browser: the Hosts table (suspect first, sortable, sparklines), a host's
page (verdict, advice, incidents, GPU timeline), and the links from job and worker pages."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from smon_server.runtime import BackgroundServer
from tests.api.test_jobs import SLOW_RANK, analyse, push_job
from tests.hosts.builders import analysed_job, refresh
from tests.support import factories as f
from tests.support.settings import server_settings
from tests.web.conftest import screenshot


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundServer, str]]:
    """node-7 straggled in three jobs (one with an XID and throttling on its GPU), node-8 once;
    a real ingested job whose rank 2 on node-2 straggles."""
    url = f"sqlite:///{tmp_path_factory.mktemp('web-hosts') / 'smon.db'}"
    with BackgroundServer(server_settings(url, analysis_interval=3600)) as server:
        assert server.context is not None
        db, now = server.context.db, time.time()
        sick: list[dict[str, Any]] = [
            {
                "rank": 0,
                "time": now - 3000 + 5 * k,
                "gpu_uuid": "GPU-sick",
                "throttle_reasons": 0x40 if k < 4 else 0,
            }
            for k in range(8)
        ]
        sick[5]["xid_events"] = [79]
        for i in range(3):
            analysed_job(
                db,
                f"train-<b>{i}</b>",  # escaped, never markup
                hosts=["node-7", "node-9"],
                stragglers=[(0, "gpu_throttling", 1.4)],
                slowdown=1.4,
                at=now - 86_400 * i - 60,
                samples=sick if i == 0 else [],
            )
        analysed_job(
            db, "once", hosts=["node-9", "node-8"], stragglers=[(1, "slow_worker", 1.2)], slowdown=1.2, at=now
        )
        job = f.new_job_id("web-slow")
        push_job(server, job, slow_rank=SLOW_RANK, slow_forward=0.03)
        analyse(server)
        refresh(db, time.time())
        yield server, job


def test_hosts_table_puts_suspect_hosts_first_and_sorts(
    fleet: tuple[BackgroundServer, str], page: Any
) -> None:
    server, _ = fleet
    page.goto(f"{server.http_url}/hosts")
    table = page.get_by_test_id("hosts-table")
    table.wait_for(timeout=30_000)
    rows = table.locator("tbody tr")
    hosts = [r.get_attribute("data-host") for r in rows.all()]
    assert hosts[0] == "node-7" and "node-2" in hosts and "node-8" in hosts
    first = rows.first
    assert "suspect" in first.inner_text()
    bars = [
        int(b.get_attribute("data-count")) for b in first.get_by_test_id("sparkline").locator("rect").all()
    ]
    assert len(bars) == 7 and sum(bars) == 3 and bars.count(1) == 3  # one incident on each of 3 days
    screenshot(page, "hosts")
    page.get_by_role("button", name="Host").click()
    page.wait_for_url("**/hosts?sort=host&dir=asc")
    expect(table.locator("tbody tr").first).to_have_attribute("data-host", "node-0", timeout=30_000)
    hosts = [r.get_attribute("data-host") for r in table.locator("tbody tr").all()]
    assert hosts == sorted(hosts)
    assert page.errors == []


def test_host_page_shows_why_what_to_do_and_the_gpu_timeline(
    fleet: tuple[BackgroundServer, str], page: Any
) -> None:
    server, _ = fleet
    page.goto(f"{server.http_url}/hosts/node-7")
    page.get_by_test_id("verdict").wait_for(timeout=30_000)
    assert page.get_by_test_id("suspect-badge").is_visible()
    assert "3 distinct jobs" in page.get_by_test_id("verdict").inner_text()
    advice = page.get_by_test_id("recommendation").inner_text()
    assert "vendor's diagnostics" in advice and "GPU-sick" in advice
    incidents = page.get_by_test_id("incidents-table").locator("tbody tr")
    assert [r.get_attribute("data-job") for r in incidents.all()] == [f"train-<b>{i}</b>" for i in range(3)]
    assert page.locator("b").count() == 0  # job ids are text
    timeline = page.get_by_test_id("host-timeline")
    assert timeline.get_by_test_id("tl-incident").count() == 3
    assert timeline.get_by_test_id("tl-xid").count() == 1
    assert timeline.get_by_test_id("tl-throttle").count() == 1
    screenshot(page, "host")
    incidents.first.locator("a").first.click()
    page.wait_for_url(f"**/jobs/{quote('train-<b>0</b>', safe='')}")
    assert page.errors == []


def test_job_and_worker_pages_link_to_the_hosts(fleet: tuple[BackgroundServer, str], page: Any) -> None:
    server, job = fleet
    page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}")
    link = page.get_by_test_id("stragglers").locator("a", has_text="node-2")
    link.wait_for(timeout=30_000)
    link.click()
    page.wait_for_url("**/hosts/node-2")
    page.get_by_test_id("incidents-table").wait_for(timeout=30_000)
    assert page.get_by_test_id("incidents-table").locator("tbody tr").first.get_attribute("data-job") == job
    page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}/workers/{SLOW_RANK}")
    page.locator("a", has_text="node-2").first.click()
    page.wait_for_url("**/hosts/node-2")
    assert page.errors == []
