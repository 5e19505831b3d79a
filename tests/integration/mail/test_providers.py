"""The provider backends against local fakes of their APIs (their hosts
cannot be reached from here): each fake checks the request as the provider
documents it, and each provider's answers are mapped to a retry or a dead
letter with the provider's own reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.mail import SES, Attachment, Backend, Mailer, Postmark, Resend, SendGrid
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.mail.fakehttp import FakeProvider, Reply
from tests.mail.providers import (
    AWS_KEY,
    AWS_REGION,
    AWS_SECRET,
    POSTMARK_TOKEN,
    RESEND_KEY,
    SENDGRID_KEY,
    Providers,
    raw_message,
    serve_providers,
)

TWICE = dw.Retry(attempts=2, backoff=0.01, jitter=0)
PDF = b"%PDF-1.4 receipt"


@pytest.fixture(scope="module")
def providers() -> Iterator[Providers]:
    with serve_providers() as p:
        yield p


@pytest.fixture(autouse=True)
def _fresh(providers: Providers) -> None:
    providers.reset()


def backend(name: str, base: str, **kw: Any) -> Backend:
    if name == "ses":
        return SES(AWS_REGION, access_key=AWS_KEY, secret_key=AWS_SECRET, base_url=base, **kw)
    if name == "sendgrid":
        return SendGrid(SENDGRID_KEY, base_url=base, **kw)
    if name == "postmark":
        return Postmark(POSTMARK_TOKEN, base_url=base, **kw)
    return Resend(RESEND_KEY, base_url=base, **kw)


def fake(providers: Providers, name: str) -> FakeProvider:
    fakes: dict[str, FakeProvider] = {
        "ses": providers.ses,
        "sendgrid": providers.sendgrid,
        "postmark": providers.postmark,
        "resend": providers.resend,
    }
    return fakes[name]


def mailer(app: dw.App, providers: Providers, name: str, **kw: Any) -> Mailer:
    return Mailer(
        app, backend(name, providers.base, **kw), sender="Shop <shop@example.com>", retry=TWICE
    )


PROVIDERS = ["ses", "sendgrid", "postmark", "resend"]


@pytest.mark.parametrize("name", PROVIDERS)
async def test_a_mail_is_sent_in_the_shape_the_provider_documents(
    app: dw.App, providers: Providers, name: str
) -> None:
    m = mailer(app, providers, name)
    email = m.compose(
        to="Ann <ann@example.com>",
        cc="boss@example.com",
        bcc="audit@example.com",
        reply_to="help@example.com",
        subject="Your receipt",
        text="Thanks",
        html="<p>Thanks</p>",
        attachments=[Attachment("receipt.pdf", PDF, "application/pdf")],
        tags={"kind": "receipt"},
    )
    job = await m.asend(email)
    await drain(app)
    outcome = await job.aresult(timeout=5)
    [seen] = fake(providers, name).seen
    assert outcome["status"] == "sent", seen.json
    assert outcome["provider"] == name
    assert (
        outcome["provider_id"]
        == {"ses": "ses-1", "sendgrid": "sg-1", "postmark": "pm-1", "resend": "rs-1"}[name]
    )
    body = seen.json
    if name == "ses":
        assert body["Destination"] == {
            "ToAddresses": ["Ann <ann@example.com>"],
            "CcAddresses": ["boss@example.com"],
            "BccAddresses": ["audit@example.com"],
        }
        msg = raw_message(seen)
        assert msg["Message-ID"] == email.message_id
        assert msg["Bcc"] is None
        [att] = msg.iter_attachments()
        assert (att.get_filename(), att.get_content()) == ("receipt.pdf", PDF)
        assert {"Name": "dw_id", "Value": email.id} in body["EmailTags"]
        assert {"Name": "kind", "Value": "receipt"} in body["EmailTags"]
    elif name == "sendgrid":
        assert body["personalizations"] == [
            {
                "to": [{"email": "ann@example.com", "name": "Ann"}],
                "cc": [{"email": "boss@example.com"}],
                "bcc": [{"email": "audit@example.com"}],
            }
        ]
        assert body["from"] == {"email": "shop@example.com", "name": "Shop"}
        assert body["reply_to"] == {"email": "help@example.com"}
        assert body["content"] == [
            {"type": "text/plain", "value": "Thanks"},
            {"type": "text/html", "value": "<p>Thanks</p>"},
        ]
        assert body["attachments"][0]["filename"] == "receipt.pdf"
        assert body["custom_args"] == {
            "kind": "receipt", "dw_id": email.id, "dw_message_id": email.message_id,
        }  # fmt: skip
    elif name == "postmark":
        assert (body["From"], body["To"], body["Cc"], body["Bcc"], body["ReplyTo"]) == (
            "Shop <shop@example.com>",
            "Ann <ann@example.com>",
            "boss@example.com",
            "audit@example.com",
            "help@example.com",
        )
        assert (body["TextBody"], body["HtmlBody"], body["MessageStream"]) == (
            "Thanks", "<p>Thanks</p>", "outbound",
        )  # fmt: skip
        assert body["Attachments"][0]["Name"] == "receipt.pdf"
        assert body["Metadata"] == {
            "kind": "receipt", "dw_id": email.id, "dw_message_id": email.message_id,
        }  # fmt: skip
    else:
        assert seen.headers["idempotency-key"] == email.id
        assert (body["to"], body["cc"], body["bcc"], body["reply_to"]) == (
            ["Ann <ann@example.com>"], ["boss@example.com"], ["audit@example.com"],
            ["help@example.com"],
        )  # fmt: skip
        assert body["attachments"][0] == {
            "filename": "receipt.pdf",
            "content": "JVBERi0xLjQgcmVjZWlwdA==",
            "content_type": "application/pdf",
        }
        assert {"name": "dw_id", "value": email.id} in body["tags"]


def _err(status: int, body: Any, **headers: str) -> Reply:
    return Reply(status, body, headers)


# (provider, the answer, "retry" or "dead", what the job's error must say)
ANSWERS = [
    ("ses", _err(400, {"message": "Email address is not verified."},
                 **{"x-amzn-ErrorType": "MessageRejected:http://internal.amazon.com/coral/"}),
     "dead", "MessageRejected: Email address is not verified."),
    ("ses", _err(400, {"message": "Account suspended"},
                 **{"x-amzn-ErrorType": "AccountSuspendedException:"}),
     "dead", "AccountSuspendedException"),
    ("ses", _err(429, {"message": "Maximum sending rate exceeded."},
                 **{"x-amzn-ErrorType": "TooManyRequestsException:"}),
     "retry", "TooManyRequestsException"),
    ("ses", _err(400, {"message": "Daily message quota exceeded."},
                 **{"x-amzn-ErrorType": "LimitExceededException:"}),
     "retry", "LimitExceededException"),
    ("ses", _err(500, {"message": "Internal failure"}), "retry", "Internal failure"),
    ("sendgrid", _err(400, {"errors": [{"message": "does not match a verified Sender Identity",
                                        "field": "from"}]}),
     "dead", "from: does not match a verified Sender Identity"),
    ("sendgrid", _err(401, {"errors": [{"message": "authorization grant is invalid"}]}),
     "dead", "authorization grant is invalid"),
    ("sendgrid", _err(413, {"errors": [{"message": "payload too large"}]}), "dead", "413"),
    ("sendgrid", _err(429, {"errors": [{"message": "too many requests"}]}), "retry", "too many"),
    ("sendgrid", _err(503, None), "retry", "503"),
    ("postmark", _err(422, {"ErrorCode": 406, "Message": "recipient marked as inactive"}),
     "dead", "ErrorCode 406: recipient marked as inactive"),
    ("postmark", _err(422, {"ErrorCode": 300, "Message": "Invalid 'To' address"}),
     "dead", "ErrorCode 300"),
    ("postmark", _err(401, {"ErrorCode": 10, "Message": "Bad or missing API token"}),
     "dead", "Bad or missing API token"),
    ("postmark", _err(429, {"ErrorCode": 429, "Message": "Rate limit exceeded"}),
     "retry", "Rate limit exceeded"),
    ("postmark", _err(503, {"ErrorCode": 100, "Message": "Maintenance"}), "retry", "Maintenance"),
    ("resend", _err(422, {"statusCode": 422, "name": "validation_error",
                          "message": "Invalid `to` field."}),
     "dead", "validation_error: Invalid `to` field."),
    ("resend", _err(409, {"statusCode": 409, "name": "invalid_idempotent_request",
                          "message": "Same key, different payload"}),
     "dead", "invalid_idempotent_request"),
    ("resend", _err(409, {"statusCode": 409, "name": "concurrent_idempotent_requests",
                          "message": "in progress"}),
     "retry", "concurrent_idempotent_requests"),
    ("resend", _err(429, {"statusCode": 429, "name": "rate_limit_exceeded",
                          "message": "Too many requests"}, **{"Retry-After": "1"}),
     "retry", "rate_limit_exceeded"),
    ("resend", _err(500, {"statusCode": 500, "name": "application_error",
                          "message": "Something went wrong"}),
     "retry", "application_error"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "answer", "fate", "reason"),
    ANSWERS,
    ids=[f"{a[0]}-{a[1].status}-{a[2]}" for a in ANSWERS],
)
async def test_provider_errors_are_retried_or_dead_lettered(
    app: dw.App, providers: Providers, name: str, answer: Reply, fate: str, reason: str
) -> None:
    provider = fake(providers, name)
    provider.replies = [answer]
    m = mailer(app, providers, name)
    job = await m.asend(to="ann@example.com", subject="Hi", text="Hello")
    await drain(app)
    info = await job.ainfo()
    assert info is not None
    [error] = info.message.errors
    assert reason in error.message, error.message
    assert "bad request shape" not in error.message
    if fate == "retry":
        assert info.state is State.SUCCEEDED
        assert len(provider.seen) == 2
        expected = "MailThrottled" if "Retry-After" in answer.headers else "MailDeferred"
        assert error.type == f"dumbwaiter.mail.errors.{expected}"
        assert provider.seen[0].body == provider.seen[1].body  # the same request again
    else:
        assert info.state is State.DEAD
        assert len(provider.seen) == 1
        assert error.type == "dumbwaiter.mail.errors.MailRejected"


async def test_a_provider_that_does_not_answer_in_time_is_retried(app: dw.App) -> None:
    import asyncio

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from tests.mail.fakehttp import serve

    calls = 0

    async def slow(request: Request) -> Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(1.5)
        return Response(status_code=202, headers={"X-Message-Id": "sg-2"})

    with serve(Starlette(routes=[Route("/v3/mail/send", slow, methods=["POST"])])) as base:
        m = Mailer(
            app,
            SendGrid(SENDGRID_KEY, base_url=base, timeout=0.3),
            sender="shop@example.com",
            retry=TWICE,
        )
        job = await m.asend(to="ann@example.com", subject="Hi", text="Hello")
        await drain(app)
    info = await job.ainfo()
    assert info is not None and info.state is State.SUCCEEDED
    [error] = info.message.errors
    assert error.type == "dumbwaiter.mail.errors.MailDeferred"
    assert "timed out" in error.message


async def test_resend_gets_the_same_idempotency_key_on_every_attempt(
    app: dw.App, providers: Providers
) -> None:
    providers.resend.replies = [Reply(500, {"name": "application_error", "message": "oops"})]
    m = mailer(app, providers, "resend")
    email = m.compose(to="ann@example.com", subject="Hi", text="Hello")
    await m.asend(email)
    await drain(app)
    keys = [s.headers["idempotency-key"] for s in providers.resend.seen]
    assert keys == [email.id, email.id]


def test_ses_needs_a_region_and_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(dw.ConfigurationError, match="needs a region"):
        SES()
    with pytest.raises(dw.ConfigurationError, match="needs credentials"):
        SES("eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "tok")
    ses = SES("eu-west-1")
    assert (ses.access_key, ses.session_token) == ("AKIA", "tok")
    assert ses.base_url == "https://email.eu-west-1.amazonaws.com"
    assert json.loads("{}") == {}
