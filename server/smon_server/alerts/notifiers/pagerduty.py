"""PagerDuty Events API v2: trigger / acknowledge / resolve one incident per dedup key."""

from __future__ import annotations

from typing import Any

from smon_server.alerts.notifiers.base import Message

_ACTIONS = {"firing": "trigger", "acknowledged": "acknowledge", "resolved": "resolve"}
_SEVERITY = {"critical": "critical", "warning": "warning"}


class PagerDuty:
    name = "pagerduty"

    def __init__(self, routing_key: str, url: str) -> None:
        self.routing_key = routing_key
        self.url = url

    def payload(self, m: Message) -> dict[str, Any] | None:
        body: dict[str, Any] = {
            "routing_key": self.routing_key,
            "event_action": _ACTIONS[m.event],
            "dedup_key": m.dedup_key,
        }
        if m.event != "firing":
            return body  # acknowledge / resolve need nothing else
        details: dict[str, Any] = {"job": m.job_id, "rule": m.rule, **m.details}
        if not m.job_id:  # a per-host rule: the host, its GPUs and the jobs are in m.details
            details.pop("job")
        if m.worst_ranks:
            details["worst_ranks"] = m.worst_ranks
        if m.recommendation:
            details["recommendation"] = m.recommendation
        body["payload"] = {
            "summary": m.summary[:1024],
            "source": m.host or m.job_id,
            "severity": _SEVERITY.get(m.severity, "error"),
            "component": m.job_id or m.host,
            "group": m.rule,
            "class": m.cause or m.rule,
            "custom_details": details,
        }
        what = f"Job {m.job_id}" if m.job_id else f"Host {m.host}"
        body["links"] = [{"href": m.link, "text": f"{what} in SMon"}]
        return body
