"""E-mail as jobs: ``Mailer(app, backend)`` sends through SMTP or a provider's
HTTP API (SES, SendGrid, Postmark, Resend), with Jinja2 templates,
attachments, a stable Message-ID per delivery, a record of sent Message-IDs,
retries on transient refusals, dead letters with the server's reason on
permanent ones, and a suppression list fed by bounce and complaint webhooks
(``dumbwaiter.mail.feedback``).  docs/mail.md is the guide.

    from dumbwaiter.mail import SMTP, Mailer

    mailer = Mailer(app, SMTP("localhost", 1025), sender="shop@example.com")
    mailer.send(to="ann@example.com", subject="Hi", text="Hello Ann")

``pip install 'dumbwaiter[mail]'`` brings aiosmtplib, httpx, Jinja2 and
Starlette; each is imported only by the part that uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .attachments import Attachment
from .backends import Backend, Memory, Sent
from .errors import (
    InvalidEmail,
    MailDeferred,
    MailError,
    MailRejected,
    MailThrottled,
    MailTooLarge,
    TemplateError,
)
from .events import MailBounced, MailComplained
from .mailer import Mailer
from .message import Email
from .suppression import Suppression

if TYPE_CHECKING:
    from .backends import SES, SMTP, Postmark, Resend, SendGrid
    from .templates import Templates

__all__ = [
    "SES",
    "SMTP",
    "Attachment",
    "Backend",
    "Email",
    "InvalidEmail",
    "MailBounced",
    "MailComplained",
    "MailDeferred",
    "MailError",
    "MailRejected",
    "MailThrottled",
    "MailTooLarge",
    "Mailer",
    "Memory",
    "Postmark",
    "Resend",
    "SendGrid",
    "Sent",
    "Suppression",
    "TemplateError",
    "Templates",
]


def __getattr__(name: str) -> Any:
    if name in ("SMTP", "SES", "SendGrid", "Postmark", "Resend"):
        from . import backends

        return getattr(backends, name)
    if name == "Templates":
        from .templates import Templates

        return Templates
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
