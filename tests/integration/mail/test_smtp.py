"""Mail through a real SMTP server (aiosmtpd on loopback), run by a real worker.

What a user relies on: the message arrives as composed (headers, the
text/html alternative, attachments, Bcc only on the envelope), its
Message-ID is the one ``compose`` gave and stays the same on a retry, a 4xx
reply is retried and delivered once, a 5xx reply dead-letters the job with
the server's words, and a Message-ID already sent is not sent again.
"""

from __future__ import annotations

import pytest

import dumbwaiter as dw
from dumbwaiter.mail import Attachment, Mailer
from dumbwaiter.state import State
from dumbwaiter.testing import drain
from tests.mail.smtpsink import Sink


async def test_the_message_arrives_as_composed(mailer: Mailer, sink: tuple[Sink, int]) -> None:
    server, _ = sink
    pdf = b"%PDF-1.4 fake receipt \x00\x01\x02"
    email = mailer.compose(
        to="Ann <ann@example.com>",
        cc="boss@example.com",
        bcc="audit@example.com",
        reply_to="help@example.com",
        subject="Your receipt",
        text="Thanks, Ann.",
        html="<p>Thanks, <b>Ann</b>.</p>",
        headers={"X-Order": "o-1"},
        attachments=[Attachment("receipt.pdf", pdf, "application/pdf")],
    )
    job = await mailer.asend(email)
    await drain(mailer.app)

    [got] = server.accepted
    msg = got.message
    assert msg["Message-ID"] == email.message_id
    assert email.message_id == f"<{email.id}@example.com>"
    assert msg["From"] == "Shop <shop@example.com>"
    assert msg["To"] == "Ann <ann@example.com>"
    assert msg["Cc"] == "boss@example.com"
    assert msg["Reply-To"] == "help@example.com"
    assert msg["Subject"] == "Your receipt"
    assert msg["X-Order"] == "o-1"
    assert msg["Date"] is not None
    assert msg["Bcc"] is None  # only on the envelope
    assert got.mail_from == "shop@example.com"
    assert sorted(got.rcpt_tos) == ["ann@example.com", "audit@example.com", "boss@example.com"]
    assert msg.get_content_type() == "multipart/mixed"
    body = msg.get_body(preferencelist=("related", "html", "plain"))
    assert body is not None and body.get_content_type() == "text/html"
    [alternative, attached] = msg.iter_parts()
    assert alternative.get_content_type() == "multipart/alternative"
    kinds = [(p.get_content_type(), p.get_content().strip()) for p in alternative.iter_parts()]
    assert kinds == [("text/plain", "Thanks, Ann."), ("text/html", "<p>Thanks, <b>Ann</b>.</p>")]
    assert attached.get_filename() == "receipt.pdf"
    assert attached.get_content_type() == "application/pdf"
    assert attached.get_content() == pdf
    outcome = await job.aresult(timeout=5)
    assert outcome["status"] == "sent"
    assert outcome["message_id"] == email.message_id


async def test_a_451_is_retried_and_delivered_once_with_the_same_message_id(
    mailer: Mailer, sink: tuple[Sink, int]
) -> None:
    server, _ = sink
    server.data_replies = ["451 4.7.1 Greylisted, please try again later"]
    email = mailer.compose(to="ann@example.com", subject="Hi", text="Hello")
    job = await mailer.asend(email)
    await drain(mailer.app)

    assert [a.message_id for a in server.attempts] == [email.message_id, email.message_id]
    assert len(server.accepted) == 1
    assert (await job.aresult(timeout=5))["status"] == "sent"
    info = await job.ainfo()
    assert info is not None
    [error] = info.message.errors  # the first attempt's
    assert error.type == "dumbwaiter.mail.errors.MailDeferred"
    assert "451 4.7.1 Greylisted" in error.message


async def test_a_550_dead_letters_the_job_with_the_servers_reason(
    mailer: Mailer, sink: tuple[Sink, int]
) -> None:
    server, _ = sink
    server.rcpt_replies["nobody@example.com"] = (
        "550 5.1.1 <nobody@example.com>: Recipient address rejected: User unknown"
    )
    job = await mailer.asend(to="nobody@example.com", subject="Hi", text="Hello")
    await drain(mailer.app)

    assert await job.astatus() is State.DEAD
    info = await job.ainfo()
    assert info is not None
    [error] = info.message.errors  # no retry: a 5xx is final
    assert error.type == "dumbwaiter.mail.errors.MailRejected"
    assert "550 5.1.1" in error.message and "User unknown" in error.message
    assert server.accepted == []
    with pytest.raises(dw.JobFailed, match="User unknown"):
        await job.aresult(timeout=5)


async def test_a_554_after_data_dead_letters_too(mailer: Mailer, sink: tuple[Sink, int]) -> None:
    server, _ = sink
    server.data_replies = ["554 5.7.1 Message rejected as spam"]
    job = await mailer.asend(to="ann@example.com", subject="Hi", text="Hello")
    await drain(mailer.app)
    assert await job.astatus() is State.DEAD
    assert len(server.attempts) == 1
    with pytest.raises(dw.JobFailed, match=r"554 5\.7\.1 Message rejected as spam"):
        await job.aresult(timeout=5)


async def test_4xx_until_the_last_attempt_dead_letters_with_the_last_reply(
    mailer: Mailer, sink: tuple[Sink, int]
) -> None:
    server, _ = sink
    server.data_replies = ["452 4.3.1 Insufficient system storage"] * 3  # FAST: 3 attempts
    job = await mailer.asend(to="ann@example.com", subject="Hi", text="Hello")
    await drain(mailer.app)
    assert await job.astatus() is State.DEAD
    assert len(server.attempts) == 3 and server.accepted == []
    with pytest.raises(dw.JobFailed, match=r"452 4\.3\.1 Insufficient system storage"):
        await job.aresult(timeout=5)


async def test_a_message_id_already_sent_is_not_sent_again(
    mailer: Mailer, sink: tuple[Sink, int]
) -> None:
    server, _ = sink
    first = await mailer.asend(
        to="ann@example.com", subject="Order o-1", text="Shipped", message_id="<order-o-1@shop>"
    )
    await drain(mailer.app)
    again = await mailer.asend(
        to="ann@example.com", subject="Order o-1", text="Shipped", message_id="<order-o-1@shop>"
    )
    await drain(mailer.app)
    assert [m.message_id for m in server.accepted] == ["<order-o-1@shop>"]
    assert (await first.aresult(timeout=5))["status"] == "sent"
    outcome = await again.aresult(timeout=5)
    assert outcome["status"] == "already_sent"
    assert outcome["sent"]["job_id"] == first.id


async def test_refused_recipients_among_accepted_ones_are_in_the_outcome(
    mailer: Mailer, sink: tuple[Sink, int]
) -> None:
    server, _ = sink
    server.rcpt_replies["gone@example.com"] = "550 5.1.1 No such user"
    job = await mailer.asend(to=["ann@example.com", "gone@example.com"], subject="Hi", text="Hello")
    await drain(mailer.app)
    [got] = server.accepted
    assert got.rcpt_tos == ["ann@example.com"]
    outcome = await job.aresult(timeout=5)
    assert outcome["status"] == "sent"
    assert outcome["refused"] == {"gone@example.com": "550 5.1.1 No such user"}


async def test_a_server_that_is_not_there_is_retried(app: dw.App) -> None:
    from dumbwaiter.mail import SMTP
    from tests.integration.serverproc import free_port

    mailer = Mailer(
        app,
        SMTP("127.0.0.1", free_port(), timeout=5),
        sender="shop@example.com",
        retry=dw.Retry(attempts=2, backoff=0.01, jitter=0),
    )
    job = await mailer.asend(to="ann@example.com", subject="Hi", text="Hello")
    await drain(app)
    info = await job.ainfo()
    assert info is not None and info.state is State.DEAD
    assert [e.type for e in info.message.errors] == ["dumbwaiter.mail.errors.MailDeferred"] * 2
