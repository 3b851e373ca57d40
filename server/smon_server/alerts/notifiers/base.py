"""What a notifier is: a name, where it posts, and how one alert event becomes its JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Message:
    """One alert event, with what a page must say: what is wrong, where, how bad, what to do."""

    event: str  # firing, resolved, acknowledged
    alert_id: int
    dedup_key: str
    rule: str
    job_id: str
    host: str
    severity: str
    summary: str
    started_at: float
    resolved_at: float | None
    link: str  # the job in SMon
    slowdown: float | None = None
    waste_fraction: float | None = None
    worst_ranks: list[str] = field(default_factory=list)  # "rank 3 on node-1 (slow_worker)"
    cause: str | None = None
    recommendation: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class Notifier(Protocol):
    name: str
    url: str

    def payload(self, message: Message) -> dict[str, Any] | None:
        """The JSON to post, or None when this notifier has nothing to say about the event."""
        ...
