"""The REST API's OpenAPI schema as JSON on stdout: `python -m smon_server.api.openapi`.

The dashboard's response types (web/src/api-schema.d.ts) are generated from it by `make api-types`,
so the pages read the fields the server sends, not a copy typed again by hand.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from smon_server.api.main import create_app
from smon_server.context import ServerContext
from smon_server.settings import Settings


def schema() -> dict[str, Any]:
    """The schema of an app on throwaway settings: routes and models do not depend on them."""
    context = ServerContext.from_settings(Settings(database_url="sqlite:///:memory:", api_token=None))
    try:
        return create_app(context).openapi()
    finally:
        context.close()


def main() -> None:
    json.dump(schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
