"""The dashboard's response types (web/src/api-schema.d.ts) are generated from the server's OpenAPI
schema by `make api-types`; this fails when a response model changed and they were not regenerated."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from smon_server.api import openapi

WEB = Path(__file__).resolve().parents[2] / "web"
GENERATOR = WEB / "api-types" / "node_modules" / ".bin" / "openapi-typescript"
COMMITTED = WEB / "src" / "api-schema.d.ts"


def test_generated_api_types_match_the_servers_schema(tmp_path: Path) -> None:
    if not GENERATOR.exists():
        reason = f"{GENERATOR.relative_to(WEB.parent)} is not installed: run `make web` (make test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)  # CI builds the dashboard first: a missing generator is a broken build
        pytest.skip(reason)
    schema = tmp_path / "openapi.json"
    schema.write_text(json.dumps(openapi.schema(), indent=2) + "\n")
    generated = tmp_path / "api-schema.d.ts"
    subprocess.run(
        [GENERATOR, schema, "--output", generated], check=True, capture_output=True, cwd=tmp_path, timeout=120
    )
    assert generated.read_text() == COMMITTED.read_text(), (
        "web/src/api-schema.d.ts is stale: run `make api-types` and commit it"
    )
