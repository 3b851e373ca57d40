"""SMon server: ingest, store, analysis, alerts, metrics, REST API and the `smon` CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("smon")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
