"""Bounce and complaint webhooks, posted over real HTTP to the Starlette
routes served by uvicorn: each provider's payload becomes ``mail.bounced`` /
``mail.complained`` events that subscribers receive, hard bounces and
complaints land on the suppression list (and the mailer then skips those
addresses), and a request without valid credentials or signature changes
nothing.

The payloads follow the examples in each provider's documentation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import dumbwaiter as dw
from dumbwaiter.mail import MailBounced, MailComplained, Mailer, Memory
from dumbwaiter.mail.feedback import feedback_route
from dumbwaiter.mail.suppression import Suppressions
from dumbwaiter.testing import drain
from tests.mail.fakehttp import serve

AUTH = ("hooks", "s3cret-pass")
RESEND_SECRET = "whsec_" + base64.b64encode(b"resend-signing-key-for-tests-0123").decode()
TOPIC = "arn:aws:sns:us-east-1:123456789012:ses-feedback"


@pytest.fixture
def received(app: dw.App) -> list[dw.Event]:
    got: list[dw.Event] = []

    @app.subscribe(MailBounced, group="accounts")
    def on_bounce(event: MailBounced) -> None:
        got.append(event)

    @app.subscribe(MailComplained, group="accounts")
    def on_complaint(event: MailComplained) -> None:
        got.append(event)

    return got


@pytest.fixture
def base(app: dw.App, received: list[dw.Event]) -> Iterator[str]:
    web = Starlette(
        routes=[
            feedback_route(app, "ses", basic_auth=AUTH, topic_arns=[TOPIC]),
            feedback_route(app, "sendgrid", basic_auth=AUTH),
            feedback_route(app, "postmark", basic_auth=AUTH),
            feedback_route(app, "resend", secret=RESEND_SECRET),
        ]
    )
    with serve(web) as url:
        yield url + "/mail/feedback"


def post(
    url: str, body: Any, *, auth: tuple[str, str] | None = AUTH, **headers: str
) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url, content=raw, auth=auth, headers=headers, timeout=10)


async def suppressed(app: dw.App) -> dict[str, str]:
    return {s.address: s.reason for s in await Suppressions(app.broker).all()}


def sns(message: dict[str, Any], topic: str = TOPIC) -> dict[str, Any]:
    return {
        "Type": "Notification",
        "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
        "TopicArn": topic,
        "Message": json.dumps(message),
        "Timestamp": "2016-01-27T14:59:38.237Z",
    }


SES_BOUNCE = {
    "notificationType": "Bounce",
    "bounce": {
        "bounceType": "Permanent",
        "bounceSubType": "General",
        "bouncedRecipients": [
            {"emailAddress": "jane@example.com", "status": "5.1.1", "action": "failed",
             "diagnosticCode": "smtp; 550 5.1.1 <jane@example.com>... User unknown"},
            {"emailAddress": "richard@example.com", "status": "5.1.1", "action": "failed"},
        ],
        "timestamp": "2016-01-27T14:59:38.237Z",
        "feedbackId": "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa068a-000000",
    },
    "mail": {
        "timestamp": "2016-01-27T14:59:38.237Z",
        "messageId": "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000",
        "source": "shop@example.com",
        "destination": ["jane@example.com", "richard@example.com"],
        "headers": [{"name": "Message-ID", "value": "<0190-abc@example.com>"}],
        "tags": {"dw_id": ["0190-abc"]},
    },
}  # fmt: skip


async def test_ses_bounces_and_complaints(app: dw.App, base: str, received: list[dw.Event]) -> None:
    soft = json.loads(json.dumps(SES_BOUNCE))
    soft["bounce"]["bounceType"] = "Transient"
    soft["bounce"]["bounceSubType"] = "MailboxFull"
    soft["bounce"]["bouncedRecipients"] = [{"emailAddress": "full@example.com"}]
    complaint = {
        "eventType": "Complaint",  # configuration-set event publishing
        "complaint": {
            "complainedRecipients": [{"emailAddress": "angry@example.com"}],
            "timestamp": "2016-01-27T14:59:38.237Z",
            "complaintFeedbackType": "abuse",
        },
        "mail": {
            "messageId": "000001378603177f-7a5433e7",
            "commonHeaders": {"messageId": "<x@example.com>"},
        },
    }
    assert post(f"{base}/ses", sns(SES_BOUNCE)).json() == {"events": 2}
    assert post(f"{base}/ses", sns(soft)).json() == {"events": 1}
    assert post(f"{base}/ses", sns(complaint)).json() == {"events": 1}
    delivery = {"notificationType": "Delivery", "mail": {}, "delivery": {}}
    assert post(f"{base}/ses", sns(delivery)).json() == {"events": 0}

    assert await suppressed(app) == {
        "jane@example.com": "hard bounce: smtp; 550 5.1.1 <jane@example.com>... User unknown",
        "richard@example.com": "hard bounce: 5.1.1",
        "angry@example.com": "complaint (abuse)",
    }
    await drain(app)
    bounces = sorted((e for e in received if isinstance(e, MailBounced)), key=lambda e: e.recipient)
    assert [(e.recipient, e.hard, e.kind) for e in bounces] == [
        ("full@example.com", False, "Transient/MailboxFull"),
        ("jane@example.com", True, "Permanent/General"),
        ("richard@example.com", True, "Permanent/General"),
    ]
    jane = bounces[1]
    assert jane.provider == "ses"
    assert jane.message_id == "<0190-abc@example.com>"
    assert jane.delivery_id == "0190-abc"
    assert jane.provider_message_id == SES_BOUNCE["mail"]["messageId"]  # type: ignore[index]
    assert jane.occurred_at is not None and jane.occurred_at.year == 2016
    [angry] = [e for e in received if isinstance(e, MailComplained)]
    assert (angry.recipient, angry.feedback_type, angry.message_id) == (
        "angry@example.com", "abuse", "<x@example.com>",
    )  # fmt: skip


async def test_sendgrid_events(app: dw.App, base: str, received: list[dw.Event]) -> None:
    events = [
        {"email": "gone@example.com", "timestamp": 1513299569, "event": "bounce", "type": "bounce",
         "status": "5.0.0", "reason": "550 5.1.1 unknown user", "sg_message_id": "sg-1",
         "smtp-id": "<sg-smtp@x>", "dw_id": "0190-d", "dw_message_id": "<0190-d@example.com>"},
        {"email": "later@example.com", "timestamp": 1513299569, "event": "bounce",
         "type": "blocked", "reason": "421 try later"},
        {"email": "spam@example.com", "timestamp": 1513299569, "event": "spamreport"},
        {"email": "old@example.com", "timestamp": 1513299569, "event": "dropped",
         "reason": "Bounced Address"},
        {"email": "ok@example.com", "timestamp": 1513299569, "event": "delivered"},
    ]  # fmt: skip
    assert post(f"{base}/sendgrid", events).json() == {"events": 4}
    assert set(await suppressed(app)) == {"gone@example.com", "spam@example.com", "old@example.com"}
    await drain(app)
    by = {e.recipient: e for e in received}  # type: ignore[attr-defined]
    gone = by["gone@example.com"]
    assert isinstance(gone, MailBounced) and gone.hard
    assert (gone.message_id, gone.delivery_id, gone.provider_message_id) == (
        "<0190-d@example.com>", "0190-d", "sg-1",
    )  # fmt: skip
    assert gone.reason == "5.0.0 550 5.1.1 unknown user"
    assert isinstance(by["later@example.com"], MailBounced) and not by["later@example.com"].hard
    assert isinstance(by["spam@example.com"], MailComplained)
    assert "ok@example.com" not in by


async def test_postmark_bounce_and_spam_complaint(
    app: dw.App, base: str, received: list[dw.Event]
) -> None:
    hard = {
        "RecordType": "Bounce",
        "ID": 42,
        "Type": "HardBounce",
        "TypeCode": 1,
        "Name": "Hard bounce",
        "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
        "Description": "The server was unable to deliver your message (ex: unknown user).",
        "Details": "smtp;550 5.1.1 The email account does not exist.",
        "Email": "john@example.com",
        "BouncedAt": "2014-08-01T13:28:10.2735393-04:00",
        "Inactive": True,
        "Metadata": {"dw_id": "0190-p", "dw_message_id": "<0190-p@example.com>"},
    }
    soft = {
        **hard,
        "Type": "SoftBounce",
        "TypeCode": 4096,
        "Inactive": False,
        "Email": "soft@example.com",
        "Details": "mailbox full",
    }
    spam = {
        **hard,
        "RecordType": "SpamComplaint",
        "Type": "SpamComplaint",
        "TypeCode": 512,
        "Email": "spam@example.com",
    }
    for payload in (hard, soft, spam):
        assert post(f"{base}/postmark", payload).json() == {"events": 1}
    assert await suppressed(app) == {
        "john@example.com": "hard bounce: smtp;550 5.1.1 The email account does not exist.",
        "spam@example.com": "complaint (SpamComplaint)",
    }
    await drain(app)
    by = {e.recipient: e for e in received}  # type: ignore[attr-defined]
    john = by["john@example.com"]
    assert isinstance(john, MailBounced)
    assert (john.hard, john.kind, john.message_id, john.delivery_id) == (
        True, "HardBounce", "<0190-p@example.com>", "0190-p",
    )  # fmt: skip
    assert isinstance(by["soft@example.com"], MailBounced) and not by["soft@example.com"].hard


def resend_headers(
    body: bytes, *, secret: str = RESEND_SECRET, at: int | None = None
) -> dict[str, str]:
    msg_id, stamp = "msg_2c4bTestId", str(int(time.time()) if at is None else at)
    key = base64.b64decode(secret.removeprefix("whsec_"))
    sig = base64.b64encode(
        hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    )
    return {"svix-id": msg_id, "svix-timestamp": stamp, "svix-signature": f"v1,{sig.decode()}"}


RESEND_BOUNCE = {
    "type": "email.bounced",
    "created_at": "2024-11-22T23:41:12.126Z",
    "data": {
        "created_at": "2024-11-22T23:41:11.894719+00:00",
        "email_id": "56761188-7520-42d8-8898-ff6fc54ce618",
        "from": "Acme <onboarding@resend.dev>",
        "to": ["delivered@resend.dev"],
        "subject": "Sending this example",
        "bounce": {"message": "The recipient's email address does not exist.",
                   "subType": "Suppressed", "type": "Permanent"},
        "tags": {"dw_id": "0190-r"},
    },
}  # fmt: skip


async def test_resend_webhooks_are_verified(
    app: dw.App, base: str, received: list[dw.Event]
) -> None:
    body = json.dumps(RESEND_BOUNCE).encode()
    # a wrong secret, a stale timestamp, no signature: refused, nothing recorded
    wrong = "whsec_" + base64.b64encode(b"someone-else").decode()
    assert (
        post(f"{base}/resend", body, auth=None, **resend_headers(body, secret=wrong)).status_code
        == 401
    )
    stale = resend_headers(body, at=int(time.time()) - 3600)
    assert post(f"{base}/resend", body, auth=None, **stale).status_code == 401
    assert post(f"{base}/resend", body, auth=None).status_code == 401
    tampered = body.replace(b"delivered@resend.dev", b"victim@example.com")
    assert post(f"{base}/resend", tampered, auth=None, **resend_headers(body)).status_code == 401
    assert await suppressed(app) == {}

    r = post(f"{base}/resend", body, auth=None, **resend_headers(body))
    assert (r.status_code, r.json()) == (200, {"events": 1})
    assert set(await suppressed(app)) == {"delivered@resend.dev"}
    await drain(app)
    [bounce] = received
    assert isinstance(bounce, MailBounced)
    assert (bounce.hard, bounce.kind, bounce.delivery_id, bounce.provider_message_id) == (
        True, "Permanent/Suppressed", "0190-r", "56761188-7520-42d8-8898-ff6fc54ce618",
    )  # fmt: skip


async def test_requests_without_the_credentials_change_nothing(app: dw.App, base: str) -> None:
    payload = sns(SES_BOUNCE)
    r = post(f"{base}/ses", payload, auth=None)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert post(f"{base}/ses", payload, auth=("hooks", "guess")).status_code == 401
    assert post(f"{base}/sendgrid", [], auth=("x", "s3cret-pass")).status_code == 401
    assert post(f"{base}/ses", sns(SES_BOUNCE, topic="arn:aws:sns:evil")).status_code == 401
    assert post(f"{base}/postmark", b"not json").status_code == 400
    assert post(f"{base}/ses", {"Type": "Strange"}).status_code == 400
    big = b"[" + b" " * (1024 * 1024) + b"]"
    assert post(f"{base}/sendgrid", big).status_code == 413
    assert await suppressed(app) == {}


def test_a_route_without_authentication_is_refused(app: dw.App) -> None:
    with pytest.raises(dw.ConfigurationError, match="needs authentication"):
        feedback_route(app, "postmark")
    with pytest.raises(dw.ConfigurationError, match="unknown mail provider"):
        feedback_route(app, "mailchimp", basic_auth=AUTH)
    with pytest.raises(dw.ConfigurationError, match="Resend's"):
        feedback_route(app, "ses", secret=RESEND_SECRET)
    assert (
        feedback_route(app, "postmark", allow_unauthenticated=True).path
        == "/mail/feedback/postmark"
    )


async def test_an_sns_subscription_is_confirmed_only_on_an_aws_host(
    app: dw.App, base: str, caplog: pytest.LogCaptureFixture
) -> None:
    hits: list[str] = []

    async def confirm(request: Request) -> Response:
        hits.append(str(request.url))
        return Response("ok")

    with serve(Starlette(routes=[Route("/confirm", confirm)])) as elsewhere:
        confirmation = {
            "Type": "SubscriptionConfirmation",
            "TopicArn": TOPIC,
            "SubscribeURL": f"{elsewhere}/confirm?Action=ConfirmSubscription&Token=t",
            "Token": "t",
        }
        with caplog.at_level(logging.WARNING, logger="dumbwaiter.mail"):
            r = post(f"{base}/ses", confirmation)
    assert r.json() == {"events": 0}
    assert hits == []  # a URL outside sns.<region>.amazonaws.com is never fetched
    assert "waits for confirmation: visit" in caplog.text


async def test_after_a_hard_bounce_the_mailer_skips_the_address(app: dw.App, base: str) -> None:
    backend = Memory()
    mailer = Mailer(app, backend, sender="shop@example.com")
    post(f"{base}/ses", sns(SES_BOUNCE))
    job = await mailer.asend(to="Jane <JANE@example.com>", subject="Hi", text="Hello")
    await drain(app)
    assert backend.outbox == []
    assert (await job.aresult(timeout=5))["status"] == "suppressed"
    assert mailer.is_suppressed("jane@example.com")


async def test_a_recipient_that_is_no_address_is_reported_not_suppressed(
    app: dw.App, base: str, received: list[dw.Event]
) -> None:
    events = [{"email": "not an address", "event": "spamreport", "timestamp": 1513299569}]
    assert post(f"{base}/sendgrid", events).json() == {"events": 1}
    assert await suppressed(app) == {}
    await drain(app)
    assert [e.recipient for e in received] == ["not an address"]  # type: ignore[attr-defined]
