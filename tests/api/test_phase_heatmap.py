"""`GET /jobs/{id}/heatmap?metric=<phase>` over HTTP, on SQLite and PostgreSQL: the stored phase
columns answer with the cells a direct computation from the stored records gives, binned and
zoomed alike; the body written with array operations is the one the pydantic model gave."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from smon_server.api.schemas import HeatmapOut
from smon_server.grid import Grid
from smon_server.runtime import BackgroundServer
from smon_server.store import phase_grids, queries
from smon_server.store.models import Job
from smon_server.store.step_window import read_window
from smon_server.views.heatmap import response_json, select
from tests.api.test_jobs import SLOW_RANK, STEPS, WORLD, analyse, push_job
from tests.support import factories as f
from tests.support.heatmaps import downsample
from tests.support.settings import server_settings
from tests.support.stored import store_batches

PHASES = ("forward", "backward", "grad_sync", "data_wait", "step_time", "other", "gc", "checkpoint")


@pytest.fixture
def client(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.http_url, timeout=30) as c:
        yield c


@pytest.fixture
def job(server: BackgroundServer) -> str:
    job_id = f.new_job_id("phases")
    push_job(server, job_id, slow_rank=SLOW_RANK, slow_forward=0.03)
    analyse(server)
    return job_id


def direct(server: BackgroundServer, job_id: str, metric: str, lo: int | None, hi: int | None) -> Grid:
    """The grid from the stored step records, as the API computed it before the columns."""
    assert server.context is not None
    with server.context.db.session() as session:
        job = session.get(Job, (job_id, 1))
        assert job is not None
        records = read_window(session=session, job=job, from_step=lo, to_step=hi)
    ranks, ri = np.unique(records.rank, return_inverse=True)
    steps, si = np.unique(records.step, return_inverse=True)
    values = np.full((ranks.size, steps.size), np.nan, dtype=np.float32)
    values[ri, si] = records.duration if metric == "step_time" else records.phase_seconds(metric)
    return Grid(ranks, steps, values)


def expected(grid: Grid, job_id: str, metric: str, **params: int) -> dict:
    zoom = {k: params.get(k) for k in ("from_rank", "to_rank", "from_step", "to_step")}
    bins = {"max_ranks": params.get("max_ranks", 512), "max_steps": params.get("max_steps", 512)}
    body = downsample(select(grid, **zoom), **bins)
    return HeatmapOut(job_id=job_id, metric=metric, **body).model_dump()


def test_phase_heatmaps_equal_the_records(server: BackgroundServer, client: httpx.Client, job: str) -> None:
    assert server.context is not None
    with server.context.db.session() as session:
        key = queries.job_key(session=session, job_id=job)
        assert key is not None
        assert phase_grids.stored_range(session, key) == (0, STEPS - 1)  # served from the columns
    url = f"/api/v1/jobs/{job}/heatmap"
    for metric in PHASES:
        grid = direct(server, job, metric, 0, STEPS - 1)
        for params in (
            {},
            {"max_ranks": 3, "max_steps": 7},
            {"from_rank": SLOW_RANK, "to_rank": SLOW_RANK},
            {"from_rank": 1, "max_steps": 4},
            {"from_step": 12, "to_step": 20, "to_rank": 2},
        ):
            r = client.get(url, params={"metric": metric, **params})
            assert r.status_code == 200, r.text
            assert r.headers["content-type"] == "application/json"
            assert r.json() == expected(grid, job, metric, **params), (metric, params)
    fwd = client.get(url, params={"metric": "forward"}).json()
    assert fwd["values"][SLOW_RANK][0] == pytest.approx(0.040)
    assert fwd["values"][0][0] == pytest.approx(0.010)


@pytest.fixture
def server_between_passes(database_url: str) -> Iterator[BackgroundServer]:
    """A server that analyses only when the test says (the shared one passes every 0.5 s, and a
    pass between the test's write and its read would take the new steps into the window)."""
    with BackgroundServer(server_settings(database_url, analysis_interval=3600)) as running:
        yield running


def test_steps_outside_the_stored_window_come_from_the_records(
    server_between_passes: BackgroundServer,
) -> None:
    """Steps stored after the last pass: a range that reaches them reads them from the records;
    the default window is the pass's, as the slowdown heatmap's is."""
    server = server_between_passes
    client = httpx.Client(base_url=server.http_url, timeout=30)
    job_id = f.new_job_id("late")
    push_job(server, job_id)
    analyse(server)
    more = f.dp_job_steps(WORLD, range(STEPS, STEPS + 5), origin=time.time() - 10)
    assert server.context is not None

    batches = [f.batch(job_id, r, WORLD, seq=2, steps=more[r]) for r in range(WORLD)]
    store_batches(server.context.db, batches, now=time.time())
    url = f"/api/v1/jobs/{job_id}/heatmap"
    fresh = client.get(url, params={"metric": "backward", "from_step": 20, "to_step": STEPS + 4}).json()
    assert fresh == expected(direct(server, job_id, "backward", 20, STEPS + 4), job_id, "backward")
    assert fresh["steps"][-1] == STEPS + 4
    default = client.get(url, params={"metric": "backward"}).json()
    client.close()
    assert default["steps"] == list(range(STEPS))


def test_bad_and_unknown_metrics(client: httpx.Client, job: str) -> None:
    url = f"/api/v1/jobs/{job}/heatmap"
    nope = client.get(url, params={"metric": "no-such-phase"})
    assert nope.status_code == 200  # a phase no agent reported yet: the window, every cell null
    body = nope.json()
    assert body["ranks"] == list(range(WORLD)) and len(body["steps"]) == STEPS
    assert all(v is None for row in body["values"] for v in row)
    for bad in ("", "x" * 129):
        r = client.get(url, params={"metric": bad})
        assert r.status_code == 422, r.text
    assert client.get("/api/v1/jobs/nope/heatmap", params={"metric": "forward"}).status_code == 404
    empty = client.get(url, params={"metric": "forward", "from_rank": 50, "to_rank": 60}).json()
    assert empty["ranks"] == [] and empty["values"] == []
    # The largest rank a zoom may name (PostgreSQL's substr takes int4 byte offsets: 4 × rank
    # overflowed), alone and as a range, for stored and raw metrics.
    top = 2**31 - 1
    for metric in ("forward", "step_time", "other", "slowdown"):
        for zoom in (
            {"from_rank": top},
            {"from_rank": top, "to_rank": top},
            {"from_rank": 1, "to_rank": top},
        ):
            r = client.get(url, params={"metric": metric, **zoom})
            assert r.status_code == 200, (metric, zoom, r.text)
            assert r.json()["ranks"] == ([] if zoom["from_rank"] == top else list(range(1, WORLD)))


@pytest.mark.parametrize("shape", [(4096, 500), (7, 3), (0, 0), (5, 0), (1, 1)])
def test_the_array_built_body_is_the_models(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0])
    n, m = shape
    values = (rng.random((n, m)) * rng.choice([1e-7, 1e-3, 1.0, 40.0, 1e5], size=(n, m))).astype(np.float32)
    values[rng.random((n, m)) < 0.1] = np.nan
    if n and m:
        # Ties at the sixth decimal (2^-7 = 0.0078125) and values around them, zeros, a NaN row.
        values.flat[:6] = np.array([2**-7, 3 * 2**-7, 0.0, 1e-6, 5e-7, 2.5e-6], dtype=np.float32)
        values[n // 2] = np.nan
        values.flat[-1] = np.inf
    grid = Grid(np.arange(n, dtype=np.int64) * 3, np.arange(m, dtype=np.int64) + 7, values)
    for bins in ((512, 512), (64, 100), (1, 1)):
        body = json.loads(
            response_json(grid, job_id="j/1", metric="forward", max_ranks=bins[0], max_steps=bins[1])
        )
        model = HeatmapOut(
            job_id="j/1", metric="forward", **downsample(grid, max_ranks=bins[0], max_steps=bins[1])
        )
        want = json.loads(model.model_dump_json())
        assert body == want
