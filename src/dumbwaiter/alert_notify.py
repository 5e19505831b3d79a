"""Where alerts go: the notification (``Alert``, the JSON a webhook gets)
and the notifiers that deliver it, to the ``dumbwaiter.alerts`` log and as a
POST to webhooks.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .redact import mask_url

log = logging.getLogger("dumbwaiter.alerts")

FIRING, RESOLVED = "firing", "resolved"


@dataclass(frozen=True, slots=True)
class Alert:
    """One notification, as sent to the log and POSTed as JSON to webhooks."""

    rule: str
    subject: str
    status: str
    severity: str
    summary: str
    value: float
    threshold: float
    since: float
    at: float
    app: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "status": self.status,
            "rule": self.rule,
            "subject": self.subject,
            "severity": self.severity,
            "summary": self.summary,
            "value": self.value,
            "threshold": self.threshold,
            "since": self.since,
            "at": self.at,
            "app": self.app,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alert:
        return cls(
            rule=str(d.get("rule", "")),
            subject=str(d.get("subject", "")),
            status=str(d.get("status", FIRING)),
            severity=str(d.get("severity", "warning")),
            summary=str(d.get("summary", "")),
            value=float(d.get("value", 0.0)),
            threshold=float(d.get("threshold", 0.0)),
            since=float(d.get("since", 0.0)),
            at=float(d.get("at", 0.0)),
            app=str(d.get("app", "")),
            source=str(d.get("source", "")),
        )


class Notifier:
    async def send(self, alert: Alert) -> bool:
        """Deliver one notification; False if it could not be delivered."""
        raise NotImplementedError


class LogNotifier(Notifier):
    async def send(self, alert: Alert) -> bool:
        level = logging.INFO if alert.status == RESOLVED else logging.WARNING
        if alert.severity == "critical" and alert.status == FIRING:
            level = logging.ERROR
        log.log(
            level,
            "alert %s %s: %s",
            alert.status,
            alert.rule,
            alert.summary,
            extra={"action": "alert", "alert": alert.to_dict()},
        )
        return True


class WebhookNotifier(Notifier):
    """POST the alert as JSON to ``url`` (Slack-style bridges, Alertmanager
    webhook receivers, PagerDuty Events via a relay...).  The URL is masked in
    logs: webhook URLs often carry their secret in the path or query."""

    def __init__(
        self, url: str, *, timeout: float = 10.0, headers: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})

    def _post(self, body: bytes) -> int:
        req = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": "dumbwaiter-alerts",
                **self.headers,
            },
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            status: int = resp.status
            return status

    async def send(self, alert: Alert) -> bool:
        body = orjson.dumps(alert.to_dict())
        try:
            status = await asyncio.to_thread(self._post, body)
        except Exception as exc:
            log.error("alert webhook %s failed: %s", mask_url(self.url, path=True), exc)
            return False
        return 200 <= status < 300
