"""The MIME message of an ``Email``: what SMTP sends and SES takes raw.

Built with the standard library's ``email`` package under the SMTP policy
(CRLF line ends, lines folded under 78 characters).  A text and an html body
become a ``multipart/alternative``; attachments wrap that in a
``multipart/mixed``.  ``Bcc`` never appears in the headers: those recipients
are only on the envelope.
"""

from __future__ import annotations

from email.message import EmailMessage
from email.policy import SMTP

from .message import Email


def build(email: Email) -> EmailMessage:
    """The MIME message of ``email``, its attachments already resolved to bytes."""
    msg = EmailMessage(policy=SMTP)
    msg["From"] = email.sender
    msg["To"] = ", ".join(email.to)
    if email.cc:
        msg["Cc"] = ", ".join(email.cc)
    if email.reply_to:
        msg["Reply-To"] = ", ".join(email.reply_to)
    msg["Subject"] = email.subject
    if email.date:
        msg["Date"] = email.date
    if email.message_id:
        msg["Message-ID"] = email.message_id
    for name, value in email.headers.items():
        msg[name] = value
    if email.text is not None and email.html is not None:
        msg.set_content(email.text)
        msg.add_alternative(email.html, subtype="html")
    elif email.html is not None:
        msg.set_content(email.html, subtype="html")
    else:
        msg.set_content(email.text or "")
    for a in email.attachments:
        assert a.data is not None, "attachments are resolved before the message is built"
        main, _, sub = a.content_type.partition("/")
        msg.add_attachment(a.data, maintype=main, subtype=sub, filename=a.filename)
    return msg
