"""What sending mail can raise, sorted by what the worker must do next.

A delivery either may work later (``MailDeferred``: an SMTP 4xx reply, a
provider's 5xx or 429, a connection that failed) and is retried by the
mailer's retry policy, or never will (``MailRejected``: an SMTP 5xx reply, a
provider's 4xx) and is dead-lettered at once with the server's own words, so
the dead-letter view says why without anyone reading logs.
"""

from __future__ import annotations

from ..errors import DumbwaiterError, PayloadTooLarge
from ..retry import Reject, RetryLater


class MailError(DumbwaiterError):
    """Base class of the mail errors."""


class InvalidEmail(MailError, ValueError):
    """An e-mail that cannot be sent as given (no recipient, a malformed
    address, a header that would break the message): raised by ``compose`` /
    ``send``, at the call that made it."""


class TemplateError(MailError, ValueError):
    """A template that is missing or does not render with the context given."""


class MailTooLarge(MailError, PayloadTooLarge):
    """The job that would carry this e-mail is over the broker's message size
    limit (inline attachments travel base64 in the job): attach large files by
    reference (``Attachment.from_path`` / ``Attachment.from_url``)."""


class MailDeferred(MailError):
    """The server or provider refused the message for now (SMTP 4xx, HTTP
    429/5xx, a network failure): the job is retried by the mailer's policy
    and dead-lettered with this reason after its last attempt."""

    def __init__(self, reason: str, *, code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class MailThrottled(MailError, RetryLater):
    """The provider said when to come back (``Retry-After``): the job is
    retried then, using up one attempt like any failure."""

    def __init__(self, reason: str, after: float, *, code: int | None = None) -> None:
        RetryLater.__init__(self, after=after, reason=reason)
        self.code = code


class MailRejected(MailError, Reject):
    """The server or provider refused the message for good (SMTP 5xx, a
    provider's 4xx): dead-lettered at once, the reply in the error."""

    def __init__(self, reason: str, *, code: int | None = None) -> None:
        Reject.__init__(self, reason)
        self.code = code
