"""The REST API's OpenAPI schema as JSON on stdout: `python -m smon_server.api.openapi`.

The dashboard's response types (web/src/api-schema.d.ts) are generated from it by `make api-types`,
so the pages read the fields the server sends, not a copy typed again by hand.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from smon_server.api.main import build_app


def schema() -> dict[str, Any]:
    """The schema of the app's routes and models: they do not depend on settings or a server (the
    routes `SMON_API_TOKEN` hides are left in, as a server without one shows them)."""
    return build_app(protected=False).openapi()


def main() -> None:
    json.dump(schema(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
