"""SMTP delivery through aiosmtplib.

The server's reply decides the job's fate, as RFC 5321 defines the codes:
a 4xx reply (greylisting, a full queue, "try again later") is transient and
the job is retried by the mailer's policy; a 5xx reply (unknown user, policy
rejection, authentication refused) is permanent and the job is
dead-lettered at once with the reply text.  A connection that fails or
times out is transient.  When the server refuses some recipients but takes
the message for the others, the message counts as sent and the refused
ones are in the outcome.

One connection per message: simple and safe with any number of concurrent
jobs.  The window the mailer cannot close is here: if the connection drops
after the server took the message but before its ``250`` reached us, the
retry sends it again (with the same Message-ID).
"""

from __future__ import annotations

from email.utils import parseaddr

from ..errors import MailDeferred, MailError, MailRejected
from ..message import Email
from ..mime import build
from .base import Backend, Sent

try:
    import aiosmtplib
except ImportError as exc:  # pragma: no cover - the extra is missing
    from ...errors import MissingDependency

    raise MissingDependency(
        "SMTP delivery needs aiosmtplib, which is not installed: pip install 'dumbwaiter[mail]'"
    ) from exc


class SMTP(Backend):
    """Deliver through an SMTP server (a relay, or a provider's SMTP endpoint).

    ``use_tls`` connects with implicit TLS (port 465); ``start_tls`` upgrades
    with STARTTLS (None: when the server offers it).  ``username`` and
    ``password`` log in when given."""

    name = "smtp"

    def __init__(
        self,
        host: str = "localhost",
        port: int | None = None,
        *,
        username: str | None = None,
        password: str | None = None,
        use_tls: bool = False,
        start_tls: bool | None = None,
        timeout: float = 30.0,
        local_hostname: str | None = None,
        validate_certs: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.use_tls = use_tls
        self.start_tls = start_tls
        self.timeout = timeout
        self.local_hostname = local_hostname
        self.validate_certs = validate_certs

    def __repr__(self) -> str:
        return f"<SMTP {self.host}:{self.port or ('465' if self.use_tls else '25')}>"

    async def send(self, email: Email) -> Sent:
        msg = build(email)
        envelope_from = parseaddr(email.sender)[1]
        client = aiosmtplib.SMTP(
            hostname=self.host,
            port=self.port,
            username=self.username,
            password=self.password,
            use_tls=self.use_tls,
            start_tls=self.start_tls,
            timeout=self.timeout,
            local_hostname=self.local_hostname,
            validate_certs=self.validate_certs,
        )
        try:
            async with client:
                refused, reply = await client.send_message(
                    msg, sender=envelope_from, recipients=list(email.recipients)
                )
        except aiosmtplib.SMTPException as exc:
            raise classify(exc) from None
        except OSError as exc:
            raise MailDeferred(f"SMTP {self.host}: {exc!r}") from None
        return Sent(
            provider_id=reply.strip(),
            refused={addr: f"{r.code} {r.message}" for addr, r in refused.items()},
        )


def classify(exc: aiosmtplib.SMTPException) -> MailError:
    """The mail error an aiosmtplib exception means: 4xx and connection
    trouble are transient, 5xx permanent; the reply is in the message."""
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        codes = [r.code for r in exc.recipients]
        why = "; ".join(f"<{r.recipient}>: {r.code} {r.message}" for r in exc.recipients)
        reason = f"the SMTP server refused every recipient: {why}"
        if codes and all(c >= 500 for c in codes):
            return MailRejected(reason, code=max(codes))
        return MailDeferred(reason, code=min(codes) if codes else None)
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        what = _phase(exc)
        reason = f"the SMTP server refused {what}: {exc.code} {exc.message}"
        if 400 <= exc.code < 500:
            return MailDeferred(reason, code=exc.code)
        if exc.code >= 500:
            return MailRejected(reason, code=exc.code)
        return MailDeferred(reason, code=exc.code)
    if isinstance(exc, aiosmtplib.SMTPNotSupported):
        return MailRejected(f"the SMTP server does not support what is needed: {exc}")
    return MailDeferred(f"SMTP: {exc!r}")  # connect, disconnect, timeout


def _phase(exc: aiosmtplib.SMTPResponseException) -> str:
    if isinstance(exc, aiosmtplib.SMTPSenderRefused):
        return f"the sender <{exc.sender}> (MAIL FROM)"
    if isinstance(exc, aiosmtplib.SMTPRecipientRefused):
        return f"the recipient <{exc.recipient}> (RCPT TO)"
    if isinstance(exc, aiosmtplib.SMTPDataError):
        return "the message (DATA)"
    if isinstance(exc, aiosmtplib.SMTPAuthenticationError):
        return "the login (AUTH)"
    if isinstance(exc, aiosmtplib.SMTPHeloError):
        return "the greeting (HELO/EHLO)"
    if isinstance(exc, aiosmtplib.SMTPConnectResponseError):
        return "the connection"
    return "the command"
