"""Fake SES, SendGrid, Postmark and Resend APIs, each checking the request
shape its provider documents (auth header, method, path, JSON fields).

One Starlette app serves the four (``serve_providers``); each ``FakeProvider``
records what it was sent and answers by script (``replies``) or with the
provider's documented success.
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from dumbwaiter.mail.backends import sigv4
from tests.mail.fakehttp import FakeProvider, Reply, Seen, require, serve

AWS_KEY, AWS_SECRET, AWS_REGION = (
    "AKIDEXAMPLE",
    "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    "us-east-1",
)
SENDGRID_KEY = "SG.test-key"
POSTMARK_TOKEN = "pm-server-token"
RESEND_KEY = "re_test_key"

_TAG = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/ses/"
    r"aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<sig>[0-9a-f]{64})$"
)


def _b64(value: Any, what: str) -> bytes:
    require(isinstance(value, str), f"{what} must be base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise AssertionError(f"{what} is not base64: {exc}") from None


def _json_body(s: Seen) -> dict[str, Any]:
    require(s.method == "POST", "POST only")
    require(s.headers.get("content-type", "").startswith("application/json"), "JSON body")
    require(isinstance(s.json, dict), "a JSON object")
    assert isinstance(s.json, dict)
    return s.json


def raw_message(s: Seen) -> EmailMessage:
    data = _b64(s.json["Content"]["Raw"]["Data"], "Content.Raw.Data")
    return email.message_from_bytes(data, _class=EmailMessage, policy=email.policy.default)


def check_ses(s: Seen) -> None:
    body = _json_body(s)
    auth = _AUTH.match(s.headers.get("authorization", ""))
    require(
        auth is not None, f"a SigV4 Authorization header, got {s.headers.get('authorization')!r}"
    )
    assert auth is not None
    require(auth["key"] == AWS_KEY and auth["region"] == AWS_REGION, "the key and region signed")
    signed = auth["signed"].split(";")
    require({"host", "x-amz-date"} <= set(signed), "host and x-amz-date are signed")
    amz_date = s.headers.get("x-amz-date", "")
    now = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    own = {n: s.headers[n] for n in signed if n not in ("host", "x-amz-date")}
    expected = sigv4.sign(
        "POST", f"http://{s.headers['host']}{s.path}", own, s.body,
        access_key=AWS_KEY, secret_key=AWS_SECRET, region=AWS_REGION, service="ses", now=now,
    )["Authorization"]  # fmt: skip
    require(expected == s.headers["authorization"], "the signature checks out")
    require(isinstance(body.get("FromEmailAddress"), str), "FromEmailAddress")
    dest = body.get("Destination")
    require(
        isinstance(dest, dict) and isinstance(dest.get("ToAddresses"), list),
        "Destination.ToAddresses",
    )
    raw_message(s)  # Content.Raw.Data is a MIME message
    for tag in body.get("EmailTags", []):
        require(_TAG.match(tag["Name"]) and _TAG.match(tag["Value"]), f"EmailTags {tag}")


def check_sendgrid(s: Seen) -> None:
    body = _json_body(s)
    require(s.headers.get("authorization") == f"Bearer {SENDGRID_KEY}", "Authorization: Bearer key")
    [p] = body["personalizations"]
    require(all("email" in a for a in p["to"]), "personalizations[0].to[].email")
    require("email" in body["from"], "from.email")
    require(isinstance(body.get("subject"), str), "subject")
    types = [c["type"] for c in body["content"]]
    require(
        types in (["text/plain"], ["text/html"], ["text/plain", "text/html"]), f"content {types}"
    )
    for a in body.get("attachments", []):
        _b64(a["content"], "attachments[].content")
        require(a["filename"] and a["type"], "attachments[].filename and type")


def check_postmark(s: Seen) -> None:
    body = _json_body(s)
    require(s.headers.get("x-postmark-server-token") == POSTMARK_TOKEN, "X-Postmark-Server-Token")
    require(s.headers.get("accept") == "application/json", "Accept: application/json")
    require(isinstance(body.get("From"), str) and isinstance(body.get("To"), str), "From and To")
    require("TextBody" in body or "HtmlBody" in body, "TextBody or HtmlBody")
    for a in body.get("Attachments", []):
        _b64(a["Content"], "Attachments[].Content")
        require(a["Name"] and a["ContentType"], "Attachments[].Name and ContentType")


def check_resend(s: Seen) -> None:
    body = _json_body(s)
    require(s.headers.get("authorization") == f"Bearer {RESEND_KEY}", "Authorization: Bearer key")
    key = s.headers.get("idempotency-key", "")
    require(0 < len(key) <= 256, "Idempotency-Key of 1 to 256 characters")
    require(isinstance(body.get("from"), str) and isinstance(body.get("to"), list), "from and to[]")
    require("text" in body or "html" in body, "text or html")
    for a in body.get("attachments", []):
        _b64(a["content"], "attachments[].content")
        require(a["filename"], "attachments[].filename")
    for t in body.get("tags", []):
        require(_TAG.match(t["name"]) and _TAG.match(t["value"]), f"tags {t}")


class Providers:
    def __init__(self) -> None:
        self.ses = FakeProvider(
            "/v2/email/outbound-emails", check_ses, lambda s: Reply(200, {"MessageId": "ses-1"})
        )
        self.sendgrid = FakeProvider(
            "/v3/mail/send", check_sendgrid, lambda s: Reply(202, None, {"X-Message-Id": "sg-1"})
        )
        self.postmark = FakeProvider(
            "/email",
            check_postmark,
            lambda s: Reply(
                200, {"To": s.json["To"], "ErrorCode": 0, "Message": "OK", "MessageID": "pm-1"}
            ),
        )
        self.resend = FakeProvider("/emails", check_resend, lambda s: Reply(200, {"id": "rs-1"}))
        self.base = ""

    def all(self) -> list[FakeProvider]:
        return [self.ses, self.sendgrid, self.postmark, self.resend]

    def reset(self) -> None:
        for p in self.all():
            p.seen.clear()
            p.replies.clear()


@contextmanager
def serve_providers() -> Iterator[Providers]:
    providers = Providers()
    app = Starlette(routes=[Route(p.path, p.endpoint, methods=["POST"]) for p in providers.all()])
    with serve(app) as base:
        providers.base = base
        yield providers
