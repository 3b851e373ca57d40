"""`smon alerts`: the on-call view of SMon's incidents from a terminal, over the REST API."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

import httpx

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """'90s', '15m', '2h', '1d' (or plain seconds) as seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 30m, 2h, 1d)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def add_parser(sub: Any) -> None:
    alerts = sub.add_parser("alerts", help="list, acknowledge and silence SMon's alerts")
    alerts.add_argument(
        "--url", default=os.environ.get("SMON_URL", "http://localhost:8080"), help="SMon's URL"
    )
    alerts.add_argument("--json", action="store_true", help="print JSON")
    alerts_sub = alerts.add_subparsers(dest="alerts_command")
    ls = alerts_sub.add_parser("list", help="incidents, newest first (the default)")
    ls.add_argument("--job")
    ls.add_argument("--state", choices=("open", "pending", "firing", "resolved"), default="open")
    ack = alerts_sub.add_parser("ack", help="acknowledge an incident (also in PagerDuty)")
    ack.add_argument("id", type=int)
    ack.add_argument("--by", default=os.environ.get("USER", ""))
    silence = alerts_sub.add_parser("silence", help="keep matching alerts quiet for a while")
    silence.add_argument("--job", help="job id pattern (fnmatch)")
    silence.add_argument("--rule")
    silence.add_argument("--host")
    silence.add_argument("--for", dest="duration", type=duration, required=True, help="e.g. 30m, 2h")
    silence.add_argument("--comment", default="")
    unsilence = alerts_sub.add_parser("unsilence", help="end a silence now")
    unsilence.add_argument("id", type=int)
    alerts.set_defaults(func=main, alerts_command=None)


def main(args: argparse.Namespace) -> int:
    token = os.environ.get("SMON_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    command = args.alerts_command or "list"
    with httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=30) as client:
        try:
            if command == "ack":
                response = client.post(f"/api/v1/alerts/{args.id}/ack", json={"by": args.by})
            elif command == "silence":
                matchers = {
                    k: v for k, v in (("job", args.job), ("rule", args.rule), ("host", args.host)) if v
                }
                if not matchers:
                    print("smon alerts silence: give at least one of --job, --rule, --host", file=sys.stderr)
                    return 2
                body = {"matchers": matchers, "duration_seconds": args.duration, "comment": args.comment}
                response = client.post(
                    "/api/v1/silences", json={**body, "created_by": os.environ.get("USER", "")}
                )
            elif command == "unsilence":
                response = client.delete(f"/api/v1/silences/{args.id}")
            else:
                params = {"state": getattr(args, "state", "open")}
                if getattr(args, "job", None):
                    params["job"] = args.job
                response = client.get("/api/v1/alerts", params=params)
        except httpx.HTTPError as e:
            print(f"smon alerts: cannot reach SMon at {args.url}: {e}", file=sys.stderr)
            return 1
    if response.status_code >= 400:
        print(f"smon alerts: HTTP {response.status_code}: {response.text[:500]}", file=sys.stderr)
        return 1
    data = response.json()
    if args.json or command != "list":
        print(json.dumps(data, indent=2))
        return 0
    _table(data["alerts"])
    return 0


def _table(alerts: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    if not alerts:
        print("no alerts")
        return
    table = Table()
    for column in ("id", "state", "severity", "job", "rule", "host", "since", "acked", "summary"):
        table.add_column(column, overflow="fold")
    for a in alerts:
        state = a["state"] + (" (silenced)" if a["silenced"] else "")
        table.add_row(
            str(a["id"]),
            state,
            a["severity"],
            a["job_id"],
            a["rule"],
            a["host"],
            (a["fired_at"] or a["started_at"] or "")[:19],
            a["acked_by"] or ("yes" if a["acked_at"] else ""),
            a["summary"],
        )
    Console(width=200).print(table)
