"""Fuzzing every route from the API's own OpenAPI schema (schemathesis): whatever the input, the
answer is a clear 4xx or a success, never a server error, and the process's memory stays bounded.
The data behind it is real, stored and analysed: a job with a straggler, and jobs a careless or
hostile client sent (a phase name per span, folded past the job's limit; steps 10^12 apart on
ranks numbered up to a million), whose routes are fuzzed too.

A few dozen inputs per route and kind, the same every run, in CI; more and new ones with
SMON_FUZZ_EXAMPLES / SMON_FUZZ_SEED (tests/support/fuzzing.py)."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import given
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from smon.v1 import ingest_pb2 as pb
from smon_server.api.main import create_app
from smon_server.context import ServerContext
from smon_server.jobs.loop import analysis_pass
from smon_server.store import migrate
from tests.support import factories as f
from tests.support.fuzzing import examples
from tests.support.fuzzing import fuzz as fuzz_settings
from tests.support.settings import server_settings
from tests.support.stored import store_batches

EXAMPLES = examples(40)  # per route, method and kind of input: ~1,500 requests in all
ODD_EXAMPLES = examples(4)  # per job route, for each job a careless client sent
ODD_JOBS = ("names-job", "far-job")
MAX_GROWTH = 512 << 20  # the fuzz may raise this process's peak RSS by at most this much


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'smon.db'}"
    context = ServerContext.from_settings(server_settings(url))
    migrate.upgrade(context.db)
    records = f.dp_job_steps(4, range(40), slow_rank=1, slow_forward=0.02, origin=time.time() - 60)
    batches = [f.batch("fuzz-job", r, 4, steps=records[r]) for r in range(4)]
    # A phase name per span: 200 names, past the job's 64.
    names = f.dp_job_steps(2, range(20), origin=time.time() - 60)
    for r, rank_records in names.items():
        for i, record in enumerate(rank_records):
            for k in range(5):
                record.spans.add(kind=f"eval:{r}:{i}:{k}", start=record.start_time, duration=1e-4)
        batches.append(f.batch("names-job", r, 2, steps=rank_records))
    # Steps 10^12 apart, ranks 0, 1, 2 and 2^20 - 1 of a declared world of 2^20.
    far = f.dp_job_steps(
        4, [i * 10**12 for i in range(30)], slow_rank=2, slow_forward=0.02, origin=time.time() - 60
    )
    for r, rank_records in far.items():
        b: pb.Batch = f.batch("far-job", r, 4, steps=rank_records)
        b.coords.world_size = b.coords.dp_size = 1 << 20
        b.coords.rank = b.coords.dp_rank = r if r < 3 else (1 << 20) - 1
        batches.append(b)
    store_batches(context.db, batches, now=time.time())
    analysis_pass(context, time.time())
    yield create_app(context)
    context.close()


@pytest.fixture(scope="module")
def api_schema(app: Any) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def fuzz(operation: Any, strategy: Any, tried: list[tuple[str, int]], count: int = EXAMPLES) -> None:
    """`count` generated requests to one operation; none may get a server error."""

    @fuzz_settings(count)
    @given(case=strategy)
    def no_server_error(case: Any) -> None:
        response = case.call()
        tried.append((operation.label, response.status_code))
        assert response.status_code < 500, (case.method, case.formatted_path, case.query, response.text[:500])

    with contextlib.suppress(Unsatisfiable):  # no such input (nothing to forbid on a route without any)
        no_server_error()


def test_no_input_gets_a_server_error(api_schema: Any) -> None:
    tried: list[tuple[str, int]] = []
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for result in api_schema.get_all_operations():
        operation = result.ok()
        # Inputs the schema allows, inputs it does not, and (where a route names a job) the job
        # that exists, so the routes behind the 404 are fuzzed too.
        fuzz(operation, operation.as_strategy(), tried)
        fuzz(operation, operation.as_strategy(GenerationMode.NEGATIVE), tried)
        if "{job_id" in operation.path:
            fuzz(operation, operation.as_strategy(path_parameters={"job_id": "fuzz-job"}), tried)
            for job in ODD_JOBS:
                strategy = operation.as_strategy(path_parameters={"job_id": job})
                fuzz(operation, strategy, tried, ODD_EXAMPLES)
        if "{host}" in operation.path:  # a host the fleet view knows (the fuzz job's ranks ran there)
            fuzz(operation, operation.as_strategy(path_parameters={"host": "host-0"}), tried)
    routes = {label for label, _ in tried}
    statuses = sorted({s for _, s in tried})
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before
    print(
        f"\nfuzzed {len(tried)} requests over {len(routes)} operations; statuses {statuses}; "
        f"peak RSS grew {growth / 1e6:.0f} MB"
    )
    assert len(routes) == len(list(api_schema.get_all_operations()))
    assert growth < MAX_GROWTH
