"""The `smon` command: server, demo, db upgrade, analyze (DESIGN §6), alerts."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from smon_server.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    if getattr(args, "db", None):
        overrides["database_url"] = args.db
    if getattr(args, "http_port", None) is not None:
        overrides["http_port"] = args.http_port
    if getattr(args, "grpc_port", None) is not None:
        overrides["grpc_port"] = args.grpc_port
    return Settings(**overrides)  # type: ignore[arg-type]


def _quiet_grpc_core() -> None:
    """gRPC's C core logs each failed TLS handshake (a plain-text client retrying against a TLS
    server: a line every 50 ms) at INFO. Before grpc is imported; GRPC_VERBOSITY set wins."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def cmd_server(args: argparse.Namespace) -> int:
    _quiet_grpc_core()
    from smon_server.runtime import serve

    settings = _settings(args)
    print(
        f"SMon server: HTTP :{settings.http_port} (API docs at /docs), gRPC :{settings.grpc_port}, "
        f"database {_redact(settings.database_url)}",
        flush=True,
    )
    asyncio.run(serve(settings, freeze_heap=True))
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from smon_server.store import migrate
    from smon_server.store.db import Database

    settings = _settings(args)
    db = Database(settings.database_url)
    try:
        migrate.upgrade(db, args.revision)
        print(f"database {_redact(settings.database_url)} at revision {migrate.current_revision(db)}")
    finally:
        db.dispose()
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from smon_server import offline

    return offline.main(args.trace, args.meta, as_json=args.json, estimator=args.estimator)


def cmd_demo(args: argparse.Namespace) -> int:
    _quiet_grpc_core()
    from smon_server.demo import runner as demo

    return demo.main(
        settings=_settings(args),
        ranks=args.ranks,
        steps=args.steps,
        slow_rank=args.slow_rank,
        delay=args.delay,
        keep_running=not args.no_wait,
    )


def _redact(url: str) -> str:
    """Hide a password in a database URL before printing it."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smon", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    server = sub.add_parser("server", help="run the ingest + API server")
    server.add_argument("--db", help="database URL (default: SMON_DATABASE_URL or embedded SQLite)")
    server.add_argument("--http-port", type=int, help="HTTP port (default 8080)")
    server.add_argument("--grpc-port", type=int, help="gRPC ingest port (default 50051)")
    server.set_defaults(func=cmd_server)

    demo = sub.add_parser("demo", help="server + a small training job with a straggler")
    demo.add_argument("--db", help="database URL (default: the embedded SQLite file)")
    demo.add_argument("--http-port", type=int, help="HTTP port (default 8080)")
    demo.add_argument("--grpc-port", type=int, help="gRPC ingest port (default 50051)")
    demo.add_argument("--ranks", type=int, default=4, help="training processes (default 4)")
    demo.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    demo.add_argument("--slow-rank", type=int, default=2, help="the rank to slow down")
    demo.add_argument("--delay", type=float, default=0.03, help="extra seconds per forward")
    demo.add_argument("--no-wait", action="store_true", help="exit once the summary is shown")
    demo.set_defaults(func=cmd_demo)

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply Alembic migrations")
    upgrade.add_argument("--db", help="database URL (default: SMON_DATABASE_URL or embedded SQLite)")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=cmd_db_upgrade)

    analyze = sub.add_parser("analyze", help="what-if analysis of a per-op trace file")
    analyze.add_argument("trace", type=Path, help="per-op parquet trace")
    analyze.add_argument("--meta", type=Path, help="job meta YAML (dp/pp/tp sizes)")
    analyze.add_argument("--json", action="store_true", help="print the summary object as JSON")
    analyze.add_argument(
        "--estimator",
        choices=("paper", "robust"),
        default="paper",
        help="ideal durations: the paper's mean over all instances (default, reproduces its "
        "results) or the mean over workers that do not stand out from their peers",
    )
    analyze.set_defaults(func=cmd_analyze)

    from smon_server.alerts import cli as alerts_cli

    alerts_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # Per-request and per-migration lines drown what the user came to read.
        for noisy in ("httpx", "alembic"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
