"""What goes into a mail: templates, attachments inline and by reference,
the job size limit, the suppression list."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import dumbwaiter as dw
from dumbwaiter.mail import SMTP, Attachment, Mailer, MailTooLarge, TemplateError, Templates
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.integration.mail.conftest import FAST
from tests.mail.fakehttp import serve
from tests.mail.smtpsink import Sink

TEMPLATES = {
    "welcome": {
        "subject": "Welcome, {{ name }}!",
        "text": "Hello {{ name }}, your code is {{ code }}.",
        "html": "<p>Hello {{ name }}, your code is <b>{{ code }}</b>.</p>",
    }
}


def _mailer(app: dw.App, port: int, templates: Templates | None = None) -> Mailer:
    return Mailer(
        app,
        SMTP("127.0.0.1", port, timeout=10),
        sender="shop@example.com",
        retry=FAST,
        templates=templates,
    )


async def test_templates_render_subject_text_and_escaped_html(
    app: dw.App, sink: tuple[Sink, int]
) -> None:
    server, port = sink
    mailer = _mailer(app, port, templates=Templates(TEMPLATES))
    await mailer.asend(
        to="ann@example.com", template="welcome", context={"name": "<Ann & Co>", "code": "42"}
    )
    await drain(app)
    [got] = server.accepted
    assert got.message["Subject"] == "Welcome, <Ann & Co>!"
    plain = got.message.get_body(preferencelist=("plain",))
    html = got.message.get_body(preferencelist=("html",))
    assert plain is not None and html is not None
    assert plain.get_content().strip() == "Hello <Ann & Co>, your code is 42."
    assert html.get_content().strip() == (
        "<p>Hello &lt;Ann &amp; Co&gt;, your code is <b>42</b>.</p>"
    )


def test_templates_from_a_directory(tmp_path: Path) -> None:
    (tmp_path / "reset.subject.txt").write_text("Reset your password\n")
    (tmp_path / "reset.html").write_text('<a href="{{ link }}">reset</a>')
    r = Templates(tmp_path).render("reset", {"link": "https://x.test/?a=1&b=2"})
    assert (r.subject, r.text) == ("Reset your password\n", None)
    assert r.html == '<a href="https://x.test/?a=1&amp;b=2">reset</a>'


def test_a_template_error_fails_the_call_that_composed(app: dw.App) -> None:
    from dumbwaiter.mail import Memory

    mailer = Mailer(app, Memory(), sender="shop@example.com", templates=Templates(TEMPLATES))
    with pytest.raises(TemplateError, match="'code' is undefined"):
        mailer.send(to="ann@example.com", template="welcome", context={"name": "Ann"})
    with pytest.raises(TemplateError, match="'missing' has no subject"):
        mailer.send(to="ann@example.com", template="missing")
    assert sum(s.ready for s in app._call(app.broker.stats())) == 0  # nothing was enqueued


def test_inline_attachments_over_the_job_size_limit_fail_at_the_call(tmp_path: Path) -> None:
    from dumbwaiter.mail import Memory

    app = dw.App(f"sqlite:///{tmp_path}/small.db", max_message_size=64 * 1024)
    try:
        mailer = Mailer(app, Memory(), sender="shop@example.com")
        with pytest.raises(MailTooLarge, match=r"big\.bin 60000 bytes.*Attachment\.from_path"):
            mailer.send(
                to="ann@example.com",
                subject="Big",
                text="see attached",
                attachments=[Attachment("big.bin", b"x" * 60000)],
            )
        assert isinstance(MailTooLarge("x"), dw.PayloadTooLarge)
        # the same file by reference fits
        path = tmp_path / "big.bin"
        path.write_bytes(b"x" * 60000)
        mailer.send(
            to="ann@example.com",
            subject="Big",
            text="see attached",
            attachments=[Attachment.from_path(path)],
        )
    finally:
        app.close()


async def test_attachments_by_path_and_url_are_read_at_send_time(
    app: dw.App, sink: tuple[Sink, int], tmp_path: Path
) -> None:
    server, port = sink
    mailer = _mailer(app, port)
    report = tmp_path / "report.csv"
    report.write_text("a,b\n1,2\n")

    async def invoice(request: Request) -> Response:
        return Response(b"%PDF invoice", media_type="application/pdf")

    files = Starlette(routes=[Route("/invoice", invoice)])
    with serve(files) as base:
        job = await mailer.asend(
            to="ann@example.com",
            subject="Files",
            text="attached",
            attachments=[
                Attachment.from_path(report),
                Attachment.from_url(f"{base}/invoice", "invoice.pdf"),
            ],
        )
        report.write_text("a,b\n3,4\n")  # changed after the send: the worker reads it now
        await drain(app)
    assert (await job.aresult(timeout=5))["status"] == "sent"
    [got] = server.accepted
    parts = {p.get_filename(): p for p in got.message.iter_attachments()}
    assert parts["report.csv"].get_content_type() == "text/csv"
    assert parts["report.csv"].get_content() == "a,b\n3,4\n"
    assert parts["invoice.pdf"].get_content_type() == "application/pdf"
    assert parts["invoice.pdf"].get_content() == b"%PDF invoice"


async def test_an_attachment_url_that_is_gone_dead_letters(
    app: dw.App, sink: tuple[Sink, int]
) -> None:
    server, port = sink
    mailer = _mailer(app, port)
    with serve(Starlette(routes=[])) as base:
        job = await mailer.asend(
            to="ann@example.com",
            subject="Files",
            text="attached",
            attachments=[Attachment.from_url(f"{base}/nope.pdf", "nope.pdf")],
        )
        await drain(app)
    assert await job.astatus() is State.DEAD
    with pytest.raises(dw.JobFailed, match=r"nope\.pdf.*answered 404"):
        await job.aresult(timeout=5)
    assert server.attempts == []


async def test_a_suppressed_recipient_gets_nothing_and_the_job_says_why(
    app: dw.App, sink: tuple[Sink, int], caplog: pytest.LogCaptureFixture
) -> None:
    server, port = sink
    mailer = _mailer(app, port)
    await mailer.asuppress("Ann@Example.com", "asked us to stop")
    assert await mailer.ais_suppressed("Ann <ann@example.com>")
    with caplog.at_level(logging.WARNING, logger="dumbwaiter.mail"):
        job = await mailer.asend(to="ann@example.com", subject="Hi", text="Hello")
        await drain(app)
    assert server.attempts == []
    outcome = await job.aresult(timeout=5)
    assert outcome == {
        "status": "suppressed",
        "message_id": outcome["message_id"],
        "suppressed": ["ann@example.com"],
    }
    assert "every 'to' recipient is on the suppression list" in caplog.text
    assert "ann@example.com: asked us to stop" in caplog.text

    # a suppressed cc is dropped, the rest is sent
    job = await mailer.asend(to="bob@example.com", cc="ann@example.com", subject="Hi", text="Hello")
    await drain(app)
    [got] = server.accepted
    assert got.rcpt_tos == ["bob@example.com"] and got.message["Cc"] is None
    assert (await job.aresult(timeout=5))["suppressed"] == ["ann@example.com"]

    # taken off the list, she gets mail again
    assert await mailer.aunsuppress("ann@example.com")
    assert not await mailer.aunsuppress("ann@example.com")
    await mailer.asend(to="ann@example.com", subject="Hi again", text="Hello")
    await drain(app)
    assert [m.rcpt_tos for m in server.accepted] == [["bob@example.com"], ["ann@example.com"]]
