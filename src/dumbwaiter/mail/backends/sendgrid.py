"""SendGrid through its v3 API: ``POST /v3/mail/send``.

``Authorization: Bearer <api key>``; one personalization (to, cc, bcc),
``content`` with text/plain first then text/html (the order SendGrid
requires), attachments as base64 with their type and file name, and
``custom_args`` carrying the tags plus ``dw_id`` / ``dw_message_id``, which
SendGrid echoes in its event webhook so a bounce can be tied to the mail
that caused it.  A 202 answer is sent; its ``X-Message-Id`` is the
provider's id.  429 and 5xx are transient; other 4xx (bad request,
unverified sender, bad key, payload too large) are permanent, with
SendGrid's ``errors[].message`` as the reason.
"""

from __future__ import annotations

import base64
from email.utils import parseaddr
from typing import Any

import httpx

from ...errors import ConfigurationError
from ..message import Email
from .http import HTTPBackend, Request, json_or_none


def _addr(value: str) -> dict[str, str]:
    name, email = parseaddr(value)
    return {"email": email, "name": name} if name else {"email": email}


class SendGrid(HTTPBackend):
    """SendGrid (v3 Mail Send).  ``SendGrid(api_key="SG....")``."""

    name = "sendgrid"
    default_base_url = "https://api.sendgrid.com"

    def __init__(self, api_key: str, *, base_url: str | None = None, timeout: float = 30.0) -> None:
        if not api_key:
            raise ConfigurationError("SendGrid needs an api_key")
        super().__init__(base_url=base_url, timeout=timeout)
        self.api_key = api_key

    def request(self, email: Email) -> Request:
        personalization: dict[str, Any] = {"to": [_addr(a) for a in email.to]}
        if email.cc:
            personalization["cc"] = [_addr(a) for a in email.cc]
        if email.bcc:
            personalization["bcc"] = [_addr(a) for a in email.bcc]
        content = []
        if email.text is not None:
            content.append({"type": "text/plain", "value": email.text})
        if email.html is not None:
            content.append({"type": "text/html", "value": email.html})
        body: dict[str, Any] = {
            "personalizations": [personalization],
            "from": _addr(email.sender),
            "subject": email.subject,
            "content": content,
        }
        if len(email.reply_to) == 1:
            body["reply_to"] = _addr(email.reply_to[0])
        elif email.reply_to:
            body["reply_to_list"] = [_addr(a) for a in email.reply_to]
        if email.headers:
            body["headers"] = dict(email.headers)
        if email.attachments:
            body["attachments"] = [
                {
                    "content": base64.b64encode(a.data or b"").decode("ascii"),
                    "type": a.content_type,
                    "filename": a.filename,
                    "disposition": "attachment",
                }
                for a in email.attachments
            ]
        args = dict(email.tags)
        if email.id:
            args["dw_id"] = email.id
        if email.message_id:
            args["dw_message_id"] = email.message_id
        if args:
            body["custom_args"] = args
        return Request(
            "POST",
            f"{self.base_url}/v3/mail/send",
            headers={"Authorization": f"Bearer {self.api_key}"},
            json=body,
        )

    def accepted(self, resp: httpx.Response) -> str:
        return str(resp.headers.get("x-message-id", ""))

    def error_text(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        if isinstance(data, dict) and isinstance(data.get("errors"), list):
            parts = []
            for e in data["errors"]:
                if isinstance(e, dict):
                    field = e.get("field")
                    msg = str(e.get("message", ""))
                    parts.append(f"{field}: {msg}" if field else msg)
            if parts:
                return "; ".join(parts)
        return resp.text[:500]
