"""``mail.bounced`` and ``mail.complained``: what providers report back.

The receivers in ``dumbwaiter.mail.feedback`` turn each provider's webhook
into these events, one per recipient, and publish them; subscribe to react
(mark a user's address as bad, tell support):

    @app.subscribe(MailBounced, group="accounts")
    def on_bounce(event: MailBounced) -> None: ...

``hard`` bounces and every complaint also put the recipient on the
suppression list before the event is published.
"""

from __future__ import annotations

from datetime import datetime

from ..event import Event


class MailBounced(Event, type="mail.bounced", version=1):
    """A message to ``recipient`` bounced."""

    #: who reported it: ``ses``, ``sendgrid``, ``postmark``, ``resend``
    provider: str
    recipient: str
    #: a permanent failure (unknown user, no such domain): the address is
    #: suppressed; a soft bounce (mailbox full, greylisted) is only reported
    hard: bool
    #: the provider's own classification (``Permanent/General``, ``HardBounce``...)
    kind: str = ""
    #: the reason as the provider or the receiving server gave it
    reason: str = ""
    #: our Message-ID (``<id@domain>``) when the provider echoes it
    message_id: str | None = None
    #: the provider's id of the message
    provider_message_id: str | None = None
    #: the mailer's delivery id (``Email.id``) when the provider echoes it
    #: (SES tags, SendGrid custom_args, Postmark Metadata, Resend tags)
    delivery_id: str | None = None
    occurred_at: datetime | None = None


class MailComplained(Event, type="mail.complained", version=1):
    """``recipient`` marked a message as spam (a feedback-loop report).  The
    address is suppressed: mailing people who complain harms the sender's
    reputation for everyone else."""

    provider: str
    recipient: str
    #: the ARF feedback type when given (``abuse``, ``fraud``...)
    feedback_type: str = ""
    message_id: str | None = None
    provider_message_id: str | None = None
    delivery_id: str | None = None
    occurred_at: datetime | None = None
