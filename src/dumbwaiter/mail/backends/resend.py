"""Resend through its API: ``POST /emails``.

``Authorization: Bearer <api key>``; ``from``, ``to`` / ``cc`` / ``bcc`` /
``reply_to`` as lists, ``subject``, ``text`` / ``html``, ``headers``,
``attachments`` (``filename``, ``content`` base64, ``content_type``) and
``tags`` (``name`` / ``value``, letters, digits, ``_`` and ``-`` only).  The
delivery id goes in the ``Idempotency-Key`` header: Resend itself then
refuses to send a retried request twice within 24 hours, which closes the
window the mailer's own record cannot (a request that reached Resend but
whose answer was lost).

Errors carry a ``name``: ``rate_limit_exceeded`` / ``daily_quota_exceeded``
/ ``monthly_quota_exceeded`` (429, retried after ``Retry-After``),
``concurrent_idempotent_requests`` (409: the same key is in flight) and
5xx are transient; ``validation_error``, ``invalid_api_key``,
``invalid_idempotent_request`` and the other 4xx are permanent.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import httpx

from ...errors import ConfigurationError
from ..message import Email
from .http import HTTPBackend, Request, json_or_none

TRANSIENT_NAMES = frozenset(
    {
        "rate_limit_exceeded",
        "daily_quota_exceeded",
        "monthly_quota_exceeded",
        "concurrent_idempotent_requests",
        "application_error",
        "internal_server_error",
    }
)
_TAG = re.compile(r"[^A-Za-z0-9_-]")


class Resend(HTTPBackend):
    """Resend.  ``Resend(api_key="re_...")``."""

    name = "resend"
    default_base_url = "https://api.resend.com"

    def __init__(self, api_key: str, *, base_url: str | None = None, timeout: float = 30.0) -> None:
        if not api_key:
            raise ConfigurationError("Resend needs an api_key")
        super().__init__(base_url=base_url, timeout=timeout)
        self.api_key = api_key

    def request(self, email: Email) -> Request:
        body: dict[str, Any] = {
            "from": email.sender,
            "to": list(email.to),
            "subject": email.subject,
        }
        if email.cc:
            body["cc"] = list(email.cc)
        if email.bcc:
            body["bcc"] = list(email.bcc)
        if email.reply_to:
            body["reply_to"] = list(email.reply_to)
        if email.text is not None:
            body["text"] = email.text
        if email.html is not None:
            body["html"] = email.html
        if email.headers:
            body["headers"] = dict(email.headers)
        if email.attachments:
            body["attachments"] = [
                {
                    "filename": a.filename,
                    "content": base64.b64encode(a.data or b"").decode("ascii"),
                    "content_type": a.content_type,
                }
                for a in email.attachments
            ]
        tags = dict(email.tags)
        if email.id:
            tags["dw_id"] = email.id
        if tags:
            body["tags"] = [
                {"name": _TAG.sub("_", k)[:256], "value": _TAG.sub("_", v)[:256]}
                for k, v in tags.items()
            ]
        headers = {"Authorization": f"Bearer {self.api_key}"}
        if email.id:
            headers["Idempotency-Key"] = email.id[:256]
        return Request("POST", f"{self.base_url}/emails", headers=headers, json=body)

    def accepted(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        return str(data.get("id", "")) if isinstance(data, dict) else ""

    def error_name(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        return str(data.get("name", "")) if isinstance(data, dict) else ""

    def error_text(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        if isinstance(data, dict) and "message" in data:
            return f"{data.get('name', '')}: {data['message']}"
        return resp.text[:500]

    def transient(self, resp: httpx.Response) -> bool | None:
        name = self.error_name(resp)
        if name in TRANSIENT_NAMES:
            return True
        if name and resp.status_code < 500:
            return False
        return None
