"""A generic webhook in the shape of Alertmanager's (version 4), so whatever takes Alertmanager's
webhook (incident tools, chat bridges, custom receivers) takes SMon's."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from smon_server.alerts.notifiers.base import Message

ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "no end" in endsAt


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


class Webhook:
    name = "webhook"

    def __init__(self, url: str, public_url: str) -> None:
        self.url = url
        self.public_url = public_url

    def payload(self, m: Message) -> dict[str, Any] | None:
        if m.event == "acknowledged":
            return None  # Alertmanager's webhook has no acknowledgement
        status = "resolved" if m.event == "resolved" else "firing"
        labels = {"alertname": m.rule, "job": m.job_id, "severity": m.severity}
        if m.host:
            labels["host"] = m.host
        annotations = {"summary": m.summary}
        if m.recommendation:
            annotations["description"] = m.recommendation
        if not m.job_id and m.host:  # a per-host rule: its GPUs and the jobs it slowed
            annotations["gpus"] = ", ".join(str(g) for g in m.details.get("gpus") or [])
            annotations["jobs"] = ", ".join(
                sorted({str(j.get("job_id")) for j in m.details.get("jobs") or []})
            )
        alert = {
            "status": status,
            "labels": labels,
            "annotations": annotations,
            "startsAt": _iso(m.started_at),
            "endsAt": _iso(m.resolved_at) if m.resolved_at is not None else ZERO_TIME,
            "generatorURL": m.link,
            "fingerprint": hashlib.sha256(m.dedup_key.encode()).hexdigest()[:16],
        }
        return {
            "version": "4",
            "groupKey": m.dedup_key,
            "truncatedAlerts": 0,
            "status": status,
            "receiver": "smon",
            "groupLabels": {"alertname": m.rule, "job": m.job_id},
            "commonLabels": labels,
            "commonAnnotations": annotations,
            "externalURL": self.public_url,
            "alerts": [alert],
        }
