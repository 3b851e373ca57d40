"""The on-call dashboard (web/): its built files, served by the API's own app.

The pages are one client-side application, so every dashboard route (DESIGN §6: `/`, `/alerts`,
`/jobs/{job_id}`, `/jobs/{job_id}/workers/{rank}`, `/hosts`, `/hosts/{host}`) answers the same
`index.html`; the page reads its state from the URL and its data from the REST API. The HTML and
scripts hold no data, so they are served without the API token: the page asks for the token and
sends it with each API call.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

DIST = Path(__file__).with_name("dist")

# Scripts and styles only from this server (nothing from a CDN, no inline script), and no
# framing: agent-sent strings are rendered as text, and this stops what might slip past that.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-cache",
}

NOT_BUILT = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>SMon</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 42em; margin: 4em auto">
<h1>SMon: the dashboard is not built</h1>
<p>This server runs from a source checkout whose dashboard was not built.
Run <code>make web</code> (Node 20 and npm) in the checkout, or install SMon from a wheel,
which ships the dashboard built. The REST API at <a href="/api/v1/jobs">/api/v1/jobs</a>,
<a href="/metrics">/metrics</a> and the probes work regardless.</p></body></html>"""


def is_built() -> bool:
    return (DIST / "index.html").is_file()


def mount(app: FastAPI) -> None:
    """Add the dashboard's routes to `app` (after the API's, which take precedence)."""

    def index() -> Response:
        if not is_built():
            return HTMLResponse(NOT_BUILT, status_code=503, headers=SECURITY_HEADERS)
        return FileResponse(DIST / "index.html", media_type="text/html", headers=SECURITY_HEADERS)

    for path in ("/", "/alerts", "/hosts", "/hosts/{host_path:path}", "/jobs/{job_path:path}"):
        app.add_api_route(path, index, methods=["GET"], include_in_schema=False, response_model=None)
    # Asset names carry a content hash: they never change, so browsers keep them.
    app.mount("/assets", ImmutableFiles(directory=DIST / "assets", check_dir=False), name="assets")


class ImmutableFiles(StaticFiles):
    def file_response(self, *args, **kwargs) -> Response:  # type: ignore[no-untyped-def]
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response
