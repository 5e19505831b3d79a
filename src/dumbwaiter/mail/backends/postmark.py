"""Postmark through its API: ``POST /email``.

``X-Postmark-Server-Token`` authenticates; ``From`` / ``To`` / ``Cc`` /
``Bcc`` / ``ReplyTo`` are comma-separated strings (names allowed),
``TextBody`` / ``HtmlBody``, ``Headers`` and ``Attachments`` (``Name``,
``Content`` base64, ``ContentType``) are lists, ``Metadata`` carries the tags
plus ``dw_id`` / ``dw_message_id`` (Postmark echoes it in its bounce
webhook), ``MessageStream`` picks the stream.  Success is 200 with
``ErrorCode`` 0 and the provider's ``MessageID``.

Postmark explains errors with an ``ErrorCode``: 429 (rate limit) and 100
(maintenance) are transient, as is any 5xx; 406 (inactive recipient: it
bounced or complained before), 300 (invalid request), 10 (bad token) and
the other codes are permanent.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx

from ...errors import ConfigurationError
from ..errors import MailRejected
from ..message import Email
from .http import HTTPBackend, Request, json_or_none

#: Postmark error codes worth another attempt
TRANSIENT_CODES = frozenset({100, 429})


class Postmark(HTTPBackend):
    """Postmark.  ``Postmark(server_token="...", message_stream="outbound")``."""

    name = "postmark"
    default_base_url = "https://api.postmarkapp.com"

    def __init__(
        self,
        server_token: str,
        *,
        message_stream: str = "outbound",
        base_url: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not server_token:
            raise ConfigurationError("Postmark needs a server_token")
        super().__init__(base_url=base_url, timeout=timeout)
        self.server_token = server_token
        self.message_stream = message_stream

    def request(self, email: Email) -> Request:
        body: dict[str, Any] = {
            "From": email.sender,
            "To": ", ".join(email.to),
            "Subject": email.subject,
            "MessageStream": self.message_stream,
        }
        if email.cc:
            body["Cc"] = ", ".join(email.cc)
        if email.bcc:
            body["Bcc"] = ", ".join(email.bcc)
        if email.reply_to:
            body["ReplyTo"] = ", ".join(email.reply_to)
        if email.text is not None:
            body["TextBody"] = email.text
        if email.html is not None:
            body["HtmlBody"] = email.html
        if email.headers:
            body["Headers"] = [{"Name": k, "Value": v} for k, v in email.headers.items()]
        if email.attachments:
            body["Attachments"] = [
                {
                    "Name": a.filename,
                    "Content": base64.b64encode(a.data or b"").decode("ascii"),
                    "ContentType": a.content_type,
                }
                for a in email.attachments
            ]
        metadata = dict(email.tags)
        if email.id:
            metadata["dw_id"] = email.id
        if email.message_id:
            metadata["dw_message_id"] = email.message_id
        if metadata:
            body["Metadata"] = metadata
        return Request(
            "POST",
            f"{self.base_url}/email",
            headers={"X-Postmark-Server-Token": self.server_token, "Accept": "application/json"},
            json=body,
        )

    def accepted(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        if not isinstance(data, dict):
            return ""
        code = data.get("ErrorCode", 0)
        if code:  # a 200 that is an error all the same
            raise MailRejected(
                f"postmark answered {resp.status_code} with ErrorCode {code}: "
                f"{data.get('Message')}",
                code=resp.status_code,
            )
        return str(data.get("MessageID", ""))

    def error_code(self, resp: httpx.Response) -> int | None:
        data = json_or_none(resp)
        if isinstance(data, dict) and isinstance(data.get("ErrorCode"), int):
            return int(data["ErrorCode"])
        return None

    def error_text(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        if isinstance(data, dict) and "Message" in data:
            return f"ErrorCode {data.get('ErrorCode')}: {data['Message']}"
        return resp.text[:500]

    def transient(self, resp: httpx.Response) -> bool | None:
        code = self.error_code(resp)
        if code in TRANSIENT_CODES:
            return True
        if code is not None and resp.status_code < 500:
            return False
        return None
