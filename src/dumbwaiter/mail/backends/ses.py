"""Amazon SES through its v2 API: ``POST /v2/email/outbound-emails`` (SendEmail).

The message goes as ``Content.Raw``: the MIME message built here, with its
Message-ID, alternative parts and attachments, exactly as SMTP would send
it; ``Destination`` names the envelope recipients (Bcc included).  Requests
are signed with SigV4 (``sigv4.py``); credentials come from the arguments or
the standard ``AWS_*`` environment variables.

Errors are classified by the error type SES names (``x-amzn-ErrorType``):
``TooManyRequestsException`` / ``LimitExceededException`` (throttling) and
5xx are transient; ``MessageRejected``, ``MailFromDomainNotVerifiedException``,
``AccountSuspendedException``, ``SendingPausedException``, ``BadRequestException``
and the other 4xx are permanent.
"""

from __future__ import annotations

import base64
import json
import os
import re
from datetime import UTC, datetime
from typing import Any

import httpx

from ...errors import ConfigurationError
from ..message import Email
from ..mime import build
from . import sigv4
from .http import HTTPBackend, Request, json_or_none

#: SES error types worth another attempt (the rest of the 4xx are permanent)
TRANSIENT_TYPES = frozenset(
    {
        "TooManyRequestsException",
        "LimitExceededException",
        "ThrottlingException",
        "Throttling",
        "InternalServiceErrorException",
        "ServiceUnavailableException",
    }
)
_TAG = re.compile(r"[^A-Za-z0-9_-]")


class SES(HTTPBackend):
    """Amazon SES (API v2).  ``SES(region="eu-west-1")`` with credentials from
    the environment, or ``access_key=`` / ``secret_key=`` / ``session_token=``."""

    name = "ses"

    def __init__(
        self,
        region: str | None = None,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        session_token: str | None = None,
        configuration_set: str | None = None,
        base_url: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if not region:
            raise ConfigurationError("SES needs a region: SES(region='eu-west-1') or $AWS_REGION")
        if access_key is None and secret_key is None:  # the environment's, token and all
            access_key = os.environ.get("AWS_ACCESS_KEY_ID")
            secret_key = os.environ.get("AWS_SECRET_ACCESS_KEY")
            session_token = session_token or os.environ.get("AWS_SESSION_TOKEN")
        if not access_key or not secret_key:
            raise ConfigurationError(
                "SES needs credentials: access_key= and secret_key=, or "
                "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY"
            )
        super().__init__(
            base_url=base_url or f"https://email.{region}.amazonaws.com", timeout=timeout
        )
        self.region = region
        self.access_key = access_key
        self.secret_key = secret_key
        self.session_token = session_token
        self.configuration_set = configuration_set

    def request(self, email: Email) -> Request:
        raw = build(email).as_bytes()
        body: dict[str, Any] = {
            "FromEmailAddress": email.sender,
            "Destination": {
                "ToAddresses": list(email.to),
                "CcAddresses": list(email.cc),
                "BccAddresses": list(email.bcc),
            },
            "Content": {"Raw": {"Data": base64.b64encode(raw).decode("ascii")}},
        }
        if email.reply_to:
            body["ReplyToAddresses"] = list(email.reply_to)
        tags = {**email.tags, "dw_id": email.id} if email.id else dict(email.tags)
        if tags:
            body["EmailTags"] = [
                {"Name": _TAG.sub("_", k)[:256], "Value": _TAG.sub("_", v)[:256]}
                for k, v in tags.items()
            ]
        if self.configuration_set:
            body["ConfigurationSetName"] = self.configuration_set
        content = json.dumps(body, separators=(",", ":")).encode()
        url = f"{self.base_url}/v2/email/outbound-emails"
        headers = {"content-type": "application/json"}
        headers.update(
            sigv4.sign(
                "POST",
                url,
                headers,
                content,
                access_key=self.access_key,
                secret_key=self.secret_key,
                region=self.region,
                service="ses",
                now=datetime.now(UTC),
                session_token=self.session_token,
            )
        )
        return Request("POST", url, headers=headers, content=content)

    def accepted(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        return str(data.get("MessageId", "")) if isinstance(data, dict) else ""

    def error_type(self, resp: httpx.Response) -> str:
        """The SES error type: ``x-amzn-ErrorType`` (``Type:uri``), else the
        body's ``__type`` / ``code`` (``namespace#Type``)."""
        value = str(resp.headers.get("x-amzn-errortype", ""))
        if not value:
            data = json_or_none(resp)
            if isinstance(data, dict):
                value = str(data.get("__type") or data.get("code") or data.get("Code") or "")
        return value.split(":", 1)[0].rsplit("#", 1)[-1]

    def error_text(self, resp: httpx.Response) -> str:
        data = json_or_none(resp)
        message = ""
        if isinstance(data, dict):
            message = str(data.get("message") or data.get("Message") or "")
        kind = self.error_type(resp)
        text = message or resp.text[:500]
        return f"{kind}: {text}" if kind else text

    def transient(self, resp: httpx.Response) -> bool | None:
        kind = self.error_type(resp)
        if kind in TRANSIENT_TYPES:
            return True
        return None if resp.status_code >= 500 else False
