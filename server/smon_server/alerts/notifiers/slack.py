"""Slack incoming webhook: `text` (notifications, fallbacks) plus Block Kit `blocks`."""

from __future__ import annotations

from typing import Any

from smon_server.alerts.notifiers.base import Message


class Slack:
    name = "slack"

    def __init__(self, url: str) -> None:
        self.url = url

    def payload(self, m: Message) -> dict[str, Any] | None:
        if m.event == "acknowledged":
            return None  # Slack has no incident to update
        icon = (
            ":white_check_mark: RESOLVED"
            if m.event == "resolved"
            else f":rotating_light: {m.severity.upper()}"
        )
        text = f"{icon}: {m.summary}"
        facts = [f"*Job*\n{m.job_id}"] if m.job_id else [f"*Host*\n{m.host}"]
        if not m.job_id and m.details.get("gpus"):
            facts.append("*GPUs*\n" + "\n".join(str(g) for g in m.details["gpus"][:8]))
        if m.slowdown is not None:
            facts.append(f"*Slowdown S*\n{m.slowdown:.2f}x")
        if m.waste_fraction is not None:
            facts.append(f"*GPU time lost*\n{100 * m.waste_fraction:.0f}%")
        if m.worst_ranks:
            title = "*Worst ranks*" if m.job_id else "*Jobs it slowed*"
            facts.append(title + "\n" + "\n".join(m.worst_ranks[:5]))
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": text[:150]}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in facts]},
        ]
        if m.cause or m.recommendation:
            lines = [
                f"*Cause:* {m.cause}" if m.cause else "",
                f"*What to do:* {m.recommendation}" if m.recommendation else "",
            ]
            blocks.append(
                {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(x for x in lines if x)}}
            )
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {"type": "button", "text": {"type": "plain_text", "text": "Open in SMon"}, "url": m.link}
                ],
            }
        )
        return {"text": text, "blocks": blocks}
