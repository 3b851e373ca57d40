"""Notifiers: one module each, behind the small interface in base.py."""

from __future__ import annotations

from smon_server.alerts.notifiers.base import Message, Notifier
from smon_server.alerts.notifiers.pagerduty import PagerDuty
from smon_server.alerts.notifiers.slack import Slack
from smon_server.alerts.notifiers.webhook import Webhook
from smon_server.settings import Settings

__all__ = ["Message", "Notifier", "configured"]


def configured(settings: Settings) -> list[Notifier]:
    """The notifiers whose settings are present."""
    out: list[Notifier] = []
    if settings.slack_webhook_url:
        out.append(Slack(settings.slack_webhook_url))
    if settings.pagerduty_routing_key:
        out.append(PagerDuty(settings.pagerduty_routing_key, settings.pagerduty_url))
    if settings.webhook_url:
        out.append(Webhook(settings.webhook_url, settings.public_url))
    return out
