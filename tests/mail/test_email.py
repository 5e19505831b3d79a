"""What ``compose`` refuses, at the call, and what a job carries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dumbwaiter as dw
from dumbwaiter.mail import Attachment, Email, InvalidEmail, Mailer, Memory
from dumbwaiter.mail.backends.http import retry_after


@pytest.fixture
def mailer() -> Iterator[Mailer]:
    app = dw.App("memory://mail-units")
    yield Mailer(app, Memory(), sender="Shop <shop@example.com>")
    app.close()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"to": "not-an-address"}, "to: 'not-an-address' is not an e-mail address"),
        ({"to": "a@b.c, d@e.f"}, "holds 2 addresses; give a list"),
        ({"to": []}, "at least one 'to' recipient"),
        ({"to": "a@b.c", "cc": "x y@z"}, "cc: 'x y@z' is not an e-mail address"),
        ({"to": "a@b.c\r\nBcc: evil@x.y"}, "contains a line break"),
        ({"to": "a@b.c", "headers": {"X-A": "1\r\nBcc: evil@x.y"}}, "one line of text"),
        ({"to": "a@b.c", "headers": {"Message-ID": "<x@y>"}}, "set by the mailer"),
        ({"to": "a@b.c", "headers": {"Bad Name": "v"}}, "not a valid header field name"),
        ({"to": "a@b.c", "message_id": "no-angles@x"}, "is not '<unique@domain>'"),
        ({"to": "a@b.c", "text": None}, "a text or an html body"),
        ({"to": "a@b.c", "template": "x"}, "has no templates"),
        ({"to": "a@b.c", "context": {"a": 1}}, "context= is for template="),
        ({"to": "a@b.c", "sender": "nobody"}, "sender: 'nobody' is not an e-mail address"),
    ],
)
def test_compose_refuses_bad_input_at_the_call(
    mailer: Mailer, kw: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {"subject": "Hi", "text": "Hello", **kw}
    with pytest.raises((InvalidEmail, dw.ConfigurationError), match=match):
        mailer.compose(**args)  # type: ignore[arg-type]


def test_attachments_refuse_bad_input() -> None:
    with pytest.raises(InvalidEmail, match="give exactly one of data, path or url"):
        Attachment("a.txt")
    with pytest.raises(InvalidEmail, match="is relative"):
        Attachment.from_path("reports/a.csv")
    with pytest.raises(InvalidEmail, match="only http"):
        Attachment.from_url("file:///etc/passwd", "passwd")
    with pytest.raises(InvalidEmail, match="no / "):
        Attachment("../../etc/passwd", b"x")
    with pytest.raises(InvalidEmail, match="data must be bytes"):
        Attachment("a.txt", "text")  # type: ignore[arg-type]
    assert Attachment("a.pdf", b"x").content_type == "application/pdf"
    assert Attachment("a.unknownext", b"x").content_type == "application/octet-stream"


def test_the_subject_is_one_line(mailer: Mailer) -> None:
    email = mailer.compose(to="a@b.c", subject="Hi\r\nBcc: evil@x.y", text="x")
    assert email.subject == "Hi Bcc: evil@x.y"


def test_an_email_survives_its_job_as_json(mailer: Mailer) -> None:
    from dumbwaiter.message import dumps, loads

    email = mailer.compose(
        to=["Ann <ann@example.com>", "bob@example.com"],
        cc="c@example.com",
        subject="Hi",
        html="<p>x</p>",
        headers={"X-A": "1"},
        tags={"t": "v"},
        attachments=[
            Attachment("a.bin", b"\x00\xff"),
            Attachment.from_url("https://files.test/x", "x.pdf"),
        ],
    )
    again = Email.from_json(loads(dumps(email.to_json())))
    assert again == email
    assert again.recipients == ("ann@example.com", "bob@example.com", "c@example.com")


def test_a_malformed_job_is_refused() -> None:
    with pytest.raises(InvalidEmail, match="malformed"):
        Email.from_json({"to": ["a@b.c"]})
    with pytest.raises(InvalidEmail, match="format 2"):
        Email.from_json({"v": 2})


def test_two_mailers_of_one_name_are_refused(mailer: Mailer) -> None:
    with pytest.raises(dw.ConfigurationError, match="already registered"):
        Mailer(mailer.app, Memory())
    other = Mailer(mailer.app, Memory(), name="marketing", queue="bulk")
    assert other.task.name == "dumbwaiter.marketing.send" and other.task.queue == "bulk"


def test_retry_after_reads_seconds_and_dates() -> None:
    import httpx

    def after(value: str) -> float | None:
        return retry_after(httpx.Response(429, headers={"Retry-After": value}))

    assert after("7") == 7.0
    assert after("999999") == 6 * 3600.0  # clamped
    assert after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert after("soon") is None
    assert retry_after(httpx.Response(429)) is None


def test_smtp_replies_map_to_retry_or_dead() -> None:
    import aiosmtplib

    from dumbwaiter.mail import MailDeferred, MailRejected
    from dumbwaiter.mail.backends.smtp import classify

    assert isinstance(classify(aiosmtplib.SMTPDataError(451, "try later")), MailDeferred)
    assert isinstance(classify(aiosmtplib.SMTPDataError(554, "spam")), MailRejected)
    assert isinstance(classify(aiosmtplib.SMTPAuthenticationError(535, "bad creds")), MailRejected)
    assert isinstance(classify(aiosmtplib.SMTPConnectResponseError(421, "busy")), MailDeferred)
    assert isinstance(classify(aiosmtplib.SMTPServerDisconnected("gone")), MailDeferred)
    mixed = aiosmtplib.SMTPRecipientsRefused(
        [
            aiosmtplib.SMTPRecipientRefused(550, "no such user", "a@b.c"),
            aiosmtplib.SMTPRecipientRefused(450, "mailbox busy", "d@e.f"),
        ]
    )
    deferred = classify(mixed)
    assert isinstance(deferred, MailDeferred)  # one of them may work later
    assert "<a@b.c>: 550 no such user" in str(deferred)
    assert "<d@e.f>: 450 mailbox busy" in str(deferred)


def test_in_eager_mode_the_memory_backend_has_the_mail_at_once() -> None:
    app = dw.App("memory://mail-eager", eager=True)
    try:
        outbox = Memory()
        mailer = Mailer(app, outbox, sender="shop@example.com")
        job = mailer.send(to="ann@example.com", subject="Hi", text="Hello")
        [sent] = outbox.outbox
        assert (sent.to, sent.subject) == (("ann@example.com",), "Hi")
        assert job.result(timeout=5)["message_id"] == sent.message_id
    finally:
        app.close()


def test_a_provider_rate_becomes_the_tasks_flow_control() -> None:
    app = dw.App("memory://mail-rate")
    try:
        mailer = Mailer(app, Memory(), sender="shop@example.com", rate_limit="14/s", concurrency=4)
        assert mailer.task.flow is not None
        assert (mailer.task.flow.rate, mailer.task.flow.concurrency) == ((14, 1.0), 4)
    finally:
        app.close()


def test_each_part_imports_only_the_library_it_uses() -> None:
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        from dumbwaiter.mail import Mailer, Memory
        heavy = {"aiosmtplib", "httpx", "jinja2", "starlette"}
        assert not heavy & set(sys.modules), heavy & set(sys.modules)
        from dumbwaiter.mail import SendGrid
        assert "httpx" in sys.modules and "aiosmtplib" not in sys.modules
        from dumbwaiter.mail import SMTP
        assert "aiosmtplib" in sys.modules and "jinja2" not in sys.modules
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
