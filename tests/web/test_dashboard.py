"""The dashboard in a real browser, against a real server fed by a real straggling job.

One 4-rank gloo DDP job (torchrun, `smon.attach`) runs with rank 2 slowed in forward; the pages
must show what the API says about it, and the heatmap must *draw* rank 2 as the hot row: the
test reads the canvas's pixels back. Screenshots of each page go to build/test-output/web/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest

from smon_server.jobs.loop import analysis_pass
from smon_server.runtime import BackgroundServer
from smon_server.store.models import Alert
from tests.e2e.processes import forked, run_job_command
from tests.support.factories import stored_job
from tests.support.settings import server_settings
from tests.web.conftest import screenshot

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.postgres]

RANKS = 4
STEPS = 60
SLOW_RANK = 2
DELAY = 0.06  # seconds added to rank 2's every forward: ~2x a healthy step
HTML_JOB = 'evil-<img src=x onerror="window.__pwned=1">-<b>job</b>'


@pytest.fixture(scope="module")
def live(
    tmp_path_factory: pytest.TempPathFactory, postgres_admin_url: str
) -> Iterator[tuple[BackgroundServer, str]]:
    """A server on PostgreSQL, one real straggling job analysed, one stored job with HTML in its id."""
    from tests.support.databases import fresh_database

    with (
        fresh_database(postgres_admin_url, "smon_web") as url,
        BackgroundServer(server_settings(url, analysis_interval=3600, gpu_hour_price=2.5)) as server,
    ):
        job = f"web-demo-{time.time_ns()}"
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "SMON_DEMO_QUIET": "1",
            "SMON_SERVER": server.grpc_target,
            "SMON_JOB": job,
            "SMON_FAKE_NVML": "healthy",
            "SMON_NVML_INTERVAL": "0.5",
        }
        args = ["--steps", str(STEPS), "--slow-rank", str(SLOW_RANK), "--delay", str(DELAY)]
        done = run_job_command(forked(RANKS, args), env, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            jobs = httpx.get(f"{server.http_url}/api/v1/jobs").json()["jobs"]
            if any(j["job_id"] == job and j["last_step"] == STEPS - 1 for j in jobs):
                break
            time.sleep(0.2)
        assert server.context is not None
        now = time.time()
        with server.context.db.session() as session:
            stored_job(session, HTML_JOB, now, agents=[(0, 100.0, 1.0, False, 0)])
            # A firing incident as the alert engine stores it (the engine has its own tests).
            session.add(
                Alert(
                    dedup_key=f"smon/{job}/job_straggling",
                    rule="job_straggling",
                    job_id=job,
                    severity="warning",
                    state="firing",
                    summary=f"{job} runs 1.8x slower than without stragglers <i>(test)</i>",
                    details={},
                    started_at=now - 120,
                    fired_at=now - 60,
                    last_true_at=now,
                )
            )
            session.commit()
        analysis_pass(server.context, time.time())
        yield server, job


def api(server: BackgroundServer, path: str) -> Any:
    response = httpx.get(f"{server.http_url}/api/v1{path}", timeout=60)
    response.raise_for_status()
    return response.json()


def unexpected(errors: list[str]) -> list[str]:
    """Page errors other than failed requests (a 401 or 404 the page handles is logged by Chromium)."""
    return [e for e in errors if "Failed to load resource" not in e]


def row_heat(page: Any) -> dict[int, float]:
    """Per heatmap row (keyed by its first rank), how hot it is drawn: the colour scale's green
    channel falls as the value rises, so 255 − green, averaged along the row's middle line."""
    heat = page.evaluate(
        """() => {
          const c = document.querySelector('[data-testid=heatmap-canvas]');
          const rows = JSON.parse(c.dataset.rows);
          const plot = JSON.parse(c.dataset.plot);
          const ratio = c.width / c.getBoundingClientRect().width;
          const ctx = c.getContext('2d');
          const out = {};
          rows.forEach((rank, i) => {
            const y = Math.floor((plot.y + (i + 0.5) * plot.h / rows.length) * ratio);
            const x = Math.ceil(plot.x * ratio);
            const line = ctx.getImageData(x, y, Math.floor(plot.w * ratio) - 2, 1).data;
            let heat = 0;
            for (let k = 0; k < line.length; k += 4) heat += 255 - line[k + 1];
            out[rank] = heat / (line.length / 4);
          });
          return out;
        }"""
    )
    return {int(rank): float(v) for rank, v in heat.items()}


def wait_for_heatmap(page: Any, metric: str) -> None:
    page.wait_for_function(
        "m => document.querySelector('[data-testid=heatmap-canvas]')?.dataset.metric === m",
        arg=metric,
        timeout=60_000,
    )


def test_jobs_page_lists_the_job_and_escapes_html(live: tuple[BackgroundServer, str], page: Any) -> None:
    server, job = live
    page.goto(server.http_url + "/")
    row = page.locator(f'tr[data-job="{job}"]')
    row.wait_for(timeout=30_000)
    listed = {j["job_id"]: j for j in api(server, "/jobs")["jobs"]}[job]
    assert f"{listed['slowdown']:.3f}×" in row.inner_text()
    assert str(listed["worst_rank"]) in row.inner_text()

    # The job whose id is HTML: shown as its literal text, no element made of it, nothing run.
    evil = page.locator("td.job-id a", has_text="<b>job</b>")
    assert evil.count() == 1
    assert evil.inner_text() == HTML_JOB
    assert page.locator("td.job-id b, td.job-id img").count() == 0
    assert page.evaluate("window.__pwned") is None

    # Sorting is in the URL; the straggling filter hides the synthetic job (never analysed).
    page.get_by_role("button", name="GPUs").click()
    assert parse_qs(urlsplit(page.url).query)["sort"] == ["world_size"]
    page.get_by_label("straggling only", exact=False).check()
    page.wait_for_function("() => document.querySelectorAll('tr[data-job]').length === 1")
    assert page.locator(f'tr[data-job="{job}"]').count() == 1
    screenshot(page, "jobs")
    assert not unexpected(page.errors), page.errors


def test_job_page_names_the_straggler_and_draws_its_row_hot(
    live: tuple[BackgroundServer, str], page: Any
) -> None:
    server, job = live
    summary = api(server, f"/jobs/{job}/summary")
    assert summary["stragglers"] and summary["stragglers"][0]["rank"] == SLOW_RANK, summary
    page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}")
    page.get_by_test_id("stragglers").wait_for(timeout=30_000)

    assert page.get_by_test_id("job-title").inner_text() == job
    assert f"{summary['slowdown']:.3f}×" in page.get_by_test_id("slowdown").inner_text()
    first = page.locator("[data-testid=stragglers] tbody tr").first
    assert first.get_attribute("data-rank") == str(SLOW_RANK)
    causes = page.locator("[data-testid=diagnoses] [data-cause]")
    assert causes.first.get_attribute("data-cause") == summary["diagnoses"][0]["cause"] == "slow_worker"

    wait_for_heatmap(page, "slowdown")
    heat = row_heat(page)
    assert sorted(heat) == list(range(RANKS))
    others = [v for rank, v in heat.items() if rank != SLOW_RANK]
    # The slow rank's S_w is far above the others' (~1.0, the coolest colour): its row must be
    # drawn clearly hotter than every other one.
    assert heat[SLOW_RANK] > max(others) + 60, heat
    page.get_by_test_id("steps-chart").wait_for()
    assert int(page.get_by_test_id("steps-chart").get_attribute("data-points") or 0) >= STEPS - 15
    screenshot(page, "job")
    assert not unexpected(page.errors), page.errors


def test_metric_and_range_change_the_drawing_and_the_url_restores_them(
    live: tuple[BackgroundServer, str], page: Any, browser: Any
) -> None:
    server, job = live
    page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}")
    wait_for_heatmap(page, "slowdown")
    before = row_heat(page)

    page.get_by_test_id("metric").select_option("forward")
    wait_for_heatmap(page, "forward")
    assert parse_qs(urlsplit(page.url).query)["metric"] == ["forward"]
    forward = row_heat(page)
    assert forward != before
    # The delay is in rank 2's forward: its forward row is the hot one too.
    assert forward[SLOW_RANK] == max(forward.values()), forward

    page.get_by_test_id("metric").select_option("data_wait")
    wait_for_heatmap(page, "data_wait")
    assert row_heat(page) != forward

    # A step range: the heatmap shows just those steps.
    page.goto(
        f"{server.http_url}/jobs/{quote(job, safe='')}?metric=forward&from_step=20&to_step=35&group=host"
    )
    wait_for_heatmap(page, "forward")
    canvas = page.get_by_test_id("heatmap-canvas")
    first, last = (int(x) for x in (canvas.get_attribute("data-steps") or "").split(","))
    assert 20 <= first <= last <= 35
    assert page.get_by_test_id("metric").input_value() == "forward"
    assert page.get_by_test_id("group-host").is_checked()

    # The same link pasted into a fresh browser session restores the same view.
    other = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        pasted = other.new_page()
        pasted.goto(page.url)
        wait_for_heatmap(pasted, "forward")
        assert pasted.get_by_test_id("heatmap-canvas").get_attribute("data-steps") == canvas.get_attribute(
            "data-steps"
        )
        assert pasted.get_by_test_id("metric").input_value() == "forward"
        assert pasted.get_by_test_id("group-host").is_checked()
    finally:
        other.close()
    screenshot(page, "job-range")
    assert not unexpected(page.errors), page.errors


def test_worker_page_shows_phases_beside_gpu_health(live: tuple[BackgroundServer, str], page: Any) -> None:
    server, job = live
    page.goto(f"{server.http_url}/jobs/{quote(job, safe='')}")
    page.get_by_test_id("stragglers").wait_for(timeout=30_000)
    rank_link = f"[data-testid=stragglers] tr[data-rank='{SLOW_RANK}'] a[href$='/workers/{SLOW_RANK}']"
    page.locator(rank_link).click()
    page.wait_for_url(f"**/workers/{SLOW_RANK}")
    page.get_by_test_id("phase-chart").wait_for(timeout=30_000)
    worker = api(server, f"/jobs/{job}/workers/{SLOW_RANK}")
    assert int(page.get_by_test_id("phase-chart").get_attribute("data-points") or 0) == len(worker["steps"])
    assert worker["gpu"], "the fake NVML sampler sent no GPU samples"
    assert int(page.get_by_test_id("clock-chart").get_attribute("data-points") or 0) == len(worker["gpu"])
    assert worker["host"] in page.locator("main").inner_text()
    screenshot(page, "worker")
    assert not unexpected(page.errors), page.errors


def test_alerts_page_acknowledges_and_silences(live: tuple[BackgroundServer, str], page: Any) -> None:
    server, job = live
    page.goto(server.http_url + "/")
    badge = page.locator(f'tr[data-job="{job}"] .badge.firing')
    badge.wait_for(timeout=30_000)
    assert badge.inner_text() == "1 firing"
    badge.click()
    page.wait_for_url("**/alerts?job=*")
    # The open alerts' table comes first; a resolved one may follow once the job's alerts resolve.
    table = page.get_by_test_id("alerts-table").first
    table.wait_for(timeout=30_000)
    assert "<i>(test)</i>" in table.inner_text()  # the summary as text, not markup
    assert table.locator("i").count() == 0

    page.get_by_placeholder("name (shown on acks)").fill("oncall-ana")
    table.get_by_role("button", name="Acknowledge").click()
    table.get_by_text("oncall-ana").wait_for(timeout=10_000)
    alert = api(server, f"/alerts?job={quote(job, safe='')}")["alerts"][0]
    assert alert["acked_by"] == "oncall-ana" and alert["acked_at"]

    page.get_by_placeholder("rule").fill("job_straggling")
    page.get_by_placeholder("why").fill("browser test")
    page.get_by_role("button", name="Silence", exact=True).click()
    page.get_by_text("rule=job_straggling").wait_for(timeout=10_000)
    silences = api(server, "/silences")["silences"]
    assert any(
        s["matchers"] == {"job": job, "rule": "job_straggling"}
        and s["comment"] == "browser test"
        and s["created_by"] == "oncall-ana"
        for s in silences
    )
    screenshot(page, "alerts")
    assert not unexpected(page.errors), page.errors


def test_unknown_job_says_so(live: tuple[BackgroundServer, str], page: Any) -> None:
    server, _ = live
    page.goto(f"{server.http_url}/jobs/{quote('no/such job', safe='')}")
    page.get_by_test_id("no-such-job").wait_for(timeout=30_000)
    # The id as the agent would have sent it, decoded from the path (%2F is a `/`), shown as text.
    assert page.locator("h1.job-title").inner_text() == "no/such job"


def test_token_is_asked_once_and_an_empty_server_says_how_to_attach(
    tmp_path: Any, page: Any, sqlite_url: str
) -> None:
    with BackgroundServer(server_settings(sqlite_url, api_token="s3cret-token")) as server:
        page.goto(server.http_url + "/")
        form = page.get_by_test_id("token-form")
        form.wait_for(timeout=30_000)
        page.get_by_label("API token").fill("wrong")
        page.get_by_role("button", name="Continue").click()
        page.get_by_role("alert").wait_for()
        assert "token" in page.get_by_role("alert").inner_text().lower()
        page.get_by_label("API token").fill("s3cret-token")
        page.get_by_role("button", name="Continue").click()
        page.get_by_test_id("no-jobs").wait_for(timeout=30_000)
        assert "smon.attach" in page.get_by_test_id("no-jobs").inner_text()
        assert server.ports is not None  # the address agents send to, as bound
        assert f"SMON_SERVER=localhost:{server.ports.grpc} " in page.get_by_test_id("no-jobs").inner_text()
        screenshot(page, "empty")
        # Kept for the session: another page of the same tab does not ask again.
        page.goto(server.http_url + "/alerts")
        page.get_by_test_id("no-open-alerts").wait_for(timeout=30_000)
        assert page.get_by_test_id("token-form").count() == 0
        assert not unexpected(page.errors), page.errors
