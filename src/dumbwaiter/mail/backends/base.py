"""What every delivery backend is: ``send`` one resolved e-mail.

A backend's ``send`` returns a ``Sent`` when the server or provider accepted
the message, and otherwise raises ``MailDeferred`` / ``MailThrottled``
(try again later) or ``MailRejected`` (never), each with the other side's
own reason.  It gets the e-mail with its attachments already read, and is
called on the worker's event loop, so it must not block.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from ..message import Email


@dataclass(frozen=True, slots=True)
class Sent:
    """The other side accepted the message."""

    #: the provider's id of the message (SES MessageId, SendGrid
    #: X-Message-Id, Postmark MessageID, Resend id), or the SMTP reply
    provider_id: str = ""
    #: recipients the SMTP server refused while accepting the others
    #: (address -> reply); the message went to the rest
    refused: dict[str, str] = field(default_factory=dict)


class Backend(abc.ABC):
    """A way to deliver mail (SMTP, or one provider's HTTP API)."""

    #: the provider's name, in logs and in ``mail.bounced`` events
    name = "backend"

    @abc.abstractmethod
    async def send(self, email: Email) -> Sent:
        """Deliver ``email`` (attachments resolved) or raise a mail error."""

    async def aclose(self) -> None:  # noqa: B027 - most backends hold nothing
        """Release connections (a worker calls it at shutdown, if it can)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
