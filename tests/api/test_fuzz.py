"""Fuzzing every route from the API's own OpenAPI schema (schemathesis): whatever the input, the
answer is a clear 4xx or a success, never a server error. The data behind it is real: a job with
a straggler, stored and analysed."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from smon_server.api.main import create_app
from smon_server.context import ServerContext
from smon_server.ingest.validate import Limits, validate_batch
from smon_server.jobs.loop import analysis_pass
from smon_server.store import migrate
from smon_server.store.writes import write_batches
from tests import factories as f
from tests.conftest import server_settings

RANDOM = os.environ.get("SMON_FUZZ_RANDOM") == "1"
EXAMPLES = 40  # per route, method and kind of input: ~1,500 requests in all


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'smon.db'}"
    context = ServerContext.from_settings(server_settings(url))
    migrate.upgrade(context.db)
    records = f.dp_job_steps(4, range(40), slow_rank=1, slow_forward=0.02, origin=time.time() - 60)
    batches = [f.batch("fuzz-job", r, 4, steps=records[r]) for r in range(4)]
    write_batches(context.db, [validate_batch(b, Limits()) for b in batches], now=time.time())
    analysis_pass(context, time.time())
    yield create_app(context)
    context.close()


@pytest.fixture(scope="module")
def api_schema(app: Any) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def fuzz(operation: Any, strategy: Any, tried: list[tuple[str, int]]) -> None:
    """EXAMPLES generated requests to one operation; none may get a server error."""

    @given(case=strategy)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=not RANDOM,  # the same inputs every run in CI; SMON_FUZZ_RANDOM=1 explores new ones
        suppress_health_check=list(HealthCheck),
    )
    def no_server_error(case: Any) -> None:
        response = case.call()
        tried.append((operation.label, response.status_code))
        assert response.status_code < 500, (case.method, case.formatted_path, case.query, response.text[:500])

    with contextlib.suppress(Unsatisfiable):  # no such input (nothing to forbid on a route without any)
        no_server_error()


def test_no_input_gets_a_server_error(api_schema: Any) -> None:
    tried: list[tuple[str, int]] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        # Inputs the schema allows, inputs it does not, and (where a route names a job) the job
        # that exists, so the routes behind the 404 are fuzzed too.
        fuzz(operation, operation.as_strategy(), tried)
        fuzz(operation, operation.as_strategy(GenerationMode.NEGATIVE), tried)
        if "{job_id" in operation.path:
            fuzz(operation, operation.as_strategy(path_parameters={"job_id": "fuzz-job"}), tried)
    routes = {label for label, _ in tried}
    statuses = sorted({s for _, s in tried})
    print(f"\nfuzzed {len(tried)} requests over {len(routes)} operations; statuses {statuses}")
    assert len(routes) == len(list(api_schema.get_all_operations()))
