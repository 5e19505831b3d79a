"""``Mailer``: e-mail sent as jobs.

    mailer = Mailer(app, SMTP("smtp.example.com", 587, username=..., password=...),
                    sender="Shop <shop@example.com>", templates=Templates("templates/mail"))
    mailer.send(to="ann@example.com", template="receipt", context={"order": order})

Creating a Mailer registers one task on the app (``dumbwaiter.mail.send``,
queue ``mail``), so the worker that imports the same module delivers what
any producer sends; no change to the App is needed.  ``send`` checks and
renders everything at the call (bad addresses, missing template variables,
a job too large for the broker fail there) and enqueues one job whose
payload is the finished e-mail.

The job, on a worker: skip if the record of sent Message-IDs has this one
(``ledger``); drop suppressed recipients, and end without sending if no
``to`` recipient is left (``suppression``); read attachments given by
reference; hand the e-mail to the backend; record the Message-ID as sent;
return the outcome (kept as the job's result).  A backend's transient
refusal is retried by the mailer's retry policy, a permanent one
dead-letters the job at once with the server's reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import timedelta
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from ..context import Context
from ..errors import ConfigurationError, PayloadTooLarge
from ..message import dumps, uuid7
from ..retry import Retry
from .address import bare, check_address, domain_of
from .attachments import Attachment
from .errors import InvalidEmail, MailRejected, MailTooLarge
from .ledger import DEFAULT_TTL, Ledger
from .message import Email
from .suppression import Suppression, Suppressions

if TYPE_CHECKING:
    from ..app import App
    from ..job import Job
    from ..task import BoundTask, Task
    from .backends.base import Backend
    from .templates import Templates

log = logging.getLogger("dumbwaiter.mail")

#: the mailer's retry policy unless given: transient refusals (greylisting,
#: a provider's outage) get 8 attempts over about 2 hours
DEFAULT_RETRY = Retry(attempts=8, backoff=(30, 60, 120, 300, 600, 1800, 3600))
#: what the job's envelope adds to the e-mail's JSON (ids, headers, the
#: task's name...), kept free below the broker's message size limit
ENVELOPE_ALLOWANCE = 4096


class Mailer:
    """Sends e-mail through ``backend`` as jobs of ``app`` (see the module doc).

    ``name`` tells several mailers of one app apart (their tasks are
    ``dumbwaiter.<name>.send``); ``message_id_domain`` is the right-hand side
    of the Message-IDs it makes (default: the sender's domain);
    ``rate_limit`` / ``concurrency`` limit the sends across every worker
    (the task's flow control)."""

    def __init__(
        self,
        app: App,
        backend: Backend,
        *,
        sender: str | None = None,
        templates: Templates | None = None,
        queue: str = "mail",
        name: str = "mail",
        retry: Retry | None = None,
        timeout: float | timedelta = 120.0,
        keep_result: bool | float | timedelta = True,
        message_id_domain: str | None = None,
        sent_ttl: float = DEFAULT_TTL,
        rate_limit: str | tuple[int, float] | None = None,
        concurrency: int | None = None,
    ) -> None:
        from .backends.base import Backend

        if not isinstance(backend, Backend):
            raise ConfigurationError(
                f"Mailer needs a mail backend (SMTP, SES, SendGrid, Postmark, Resend, Memory), "
                f"got {backend!r}"
            )
        self.app = app
        self.backend = backend
        self.sender = check_address(sender, "sender") if sender is not None else None
        self.templates = templates
        self.name = name
        self.message_id_domain = message_id_domain
        self.sent_ttl = sent_ttl
        task_name = f"dumbwaiter.{name}.send"
        if task_name in app.tasks:
            raise ConfigurationError(
                f"a mailer named {name!r} is already registered on {app!r}; "
                "give the second one another name="
            )
        # a provider's sending rate (SES MaxSendRate...) or an SMTP relay's
        # connection limit, cluster-wide (docs/flow-control.md)
        flow: dict[str, Any] = {}
        if rate_limit is not None:
            flow["rate_limit"] = rate_limit
        if concurrency is not None:
            flow["concurrency"] = concurrency
        self.task: Task[..., Any] = app.task(
            name=task_name,
            queue=queue,
            retry=retry if retry is not None else DEFAULT_RETRY,
            timeout=timeout,
            keep_result=keep_result,
            **flow,
        )(self._deliver)

    def __repr__(self) -> str:
        return f"<Mailer {self.name} via {self.backend!r} queue={self.task.queue}>"

    # -- composing -------------------------------------------------------------

    def compose(
        self,
        *,
        to: str | Iterable[str],
        subject: str | None = None,
        text: str | None = None,
        html: str | None = None,
        template: str | None = None,
        context: Mapping[str, Any] | None = None,
        sender: str | None = None,
        cc: str | Iterable[str] | None = None,
        bcc: str | Iterable[str] | None = None,
        reply_to: str | Iterable[str] | None = None,
        headers: Mapping[str, str] | None = None,
        attachments: Iterable[Attachment] = (),
        tags: Mapping[str, str] | None = None,
        message_id: str | None = None,
    ) -> Email:
        """The e-mail ``send`` would send: checked, rendered (``template`` with
        ``context``, or ``subject`` with ``text`` and/or ``html``) and given its
        ids.  ``message_id`` replaces the made one (``<unique@domain>``): two
        sends with the same one deliver once while the record of it lasts."""
        if template is not None:
            if self.templates is None:
                raise ConfigurationError(
                    f"template {template!r}: this mailer has no templates (Mailer(templates=...))"
                )
            if text is not None or html is not None:
                raise InvalidEmail("give a template or text/html bodies, not both")
            rendered = self.templates.render(template, context or {})
            subject = rendered.subject if subject is None else subject
            text, html = rendered.text, rendered.html
        elif context is not None:
            raise InvalidEmail("context= is for template=; give the template too")
        if subject is None:
            raise InvalidEmail("an e-mail needs a subject (or a template that has one)")
        sender = sender or self.sender
        if sender is None:
            raise InvalidEmail("no sender: give sender= here or to Mailer(sender=...)")
        email = Email(
            sender=sender,
            to=tuple([to] if isinstance(to, str) else to),
            subject=subject,
            text=text,
            html=html,
            cc=_tuple(cc),
            bcc=_tuple(bcc),
            reply_to=_tuple(reply_to),
            headers=dict(headers or {}),
            attachments=tuple(attachments),
            tags=dict(tags or {}),
            message_id=message_id or "",
        )
        return self.stamp(email)

    def stamp(self, email: Email) -> Email:
        """``email`` with a delivery id, a Message-ID and a Date where it has none."""
        if email.id and email.message_id and email.date:
            return email
        id_ = email.id or uuid7()
        domain = self.message_id_domain or domain_of(email.sender)
        return replace(
            email,
            id=id_,
            message_id=email.message_id or f"<{id_}@{domain}>",
            date=email.date or formatdate(time.time(), usegmt=True),
        )

    # -- sending -----------------------------------------------------------------

    def send(
        self,
        email: Email | None = None,
        /,
        *,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        **compose: Any,
    ) -> Job[Any]:
        """Enqueue one e-mail: a composed ``Email``, or ``compose``'s keywords.
        Returns the job (its result is the delivery's outcome)."""
        email, payload = self._payload(email, compose)
        try:
            return self._bound(delay, priority).enqueue(payload)
        except PayloadTooLarge as exc:
            raise self._too_large(email, str(exc)) from exc

    async def asend(
        self,
        email: Email | None = None,
        /,
        *,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        **compose: Any,
    ) -> Job[Any]:
        """``send`` for async callers."""
        email, payload = self._payload(email, compose)
        try:
            return await self._bound(delay, priority).aenqueue(payload)
        except PayloadTooLarge as exc:
            raise self._too_large(email, str(exc)) from exc

    def _bound(self, delay: float | timedelta | None, priority: int | None) -> BoundTask[..., Any]:
        opts: dict[str, Any] = {}
        if delay is not None:
            opts["delay"] = delay
        if priority is not None:
            opts["priority"] = priority
        return self.task.options(**opts)

    def _payload(
        self, email: Email | None, compose: dict[str, Any]
    ) -> tuple[Email, dict[str, Any]]:
        if email is None:
            email = self.compose(**compose)
        elif compose:
            raise InvalidEmail(f"send() takes an Email or keywords, not both ({sorted(compose)})")
        elif not isinstance(email, Email):
            raise InvalidEmail(f"send() takes a dumbwaiter.mail.Email, got {email!r}")
        else:
            email = self.stamp(email)
        payload = email.to_json()
        limit = self.app.max_message_size
        if limit is not None:
            size = len(dumps(payload)) + ENVELOPE_ALLOWANCE
            if size > limit:
                raise self._too_large(email, f"the job would be about {size} bytes, over {limit}")
        return email, payload

    def _too_large(self, email: Email, why: str) -> MailTooLarge:
        inline = [a for a in email.attachments if a.data is not None]
        detail = ", ".join(f"{a.filename} {len(a.data or b'')} bytes" for a in inline)
        return MailTooLarge(
            f"e-mail {email.message_id} is too large for one job ({why}); inline attachments "
            f"travel base64 in the job ({detail or 'none'}): attach large files by reference "
            "with Attachment.from_path(...) or Attachment.from_url(...)"
        )

    # -- the job ---------------------------------------------------------------------

    async def _deliver(self, mail: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """Deliver one e-mail (the task's body; see the module doc)."""
        try:
            email = Email.from_json(mail)
        except InvalidEmail as exc:
            raise MailRejected(f"the job does not carry a valid e-mail: {exc}") from None
        mid = email.message_id or email.id
        ledger = Ledger(self.app.broker, self.sent_ttl)
        done = await ledger.get(mid) if mid else None
        if done is not None:
            log.info(
                "mail %s was already sent (job %s attempt %d): not sent again",
                mid,
                ctx.job_id,
                ctx.attempt,
                extra={"action": "mail.already_sent", "job_id": ctx.job_id},
            )
            return {"status": "already_sent", "message_id": mid, "sent": done}
        suppressed = await Suppressions(self.app.broker).which(email.recipients)
        if suppressed:
            if all(bare(a) in suppressed for a in email.to):
                log.warning(
                    "mail %s not sent: every 'to' recipient is on the suppression list (%s)",
                    mid,
                    ", ".join(
                        f"{a}: {s.reason or s.source}" for a, s in sorted(suppressed.items())
                    ),
                    extra={"action": "mail.suppressed", "job_id": ctx.job_id},
                )
                return {"status": "suppressed", "message_id": mid, "suppressed": sorted(suppressed)}
            email = email.without(suppressed)
        email = await self._resolve(email)
        sent = await self.backend.send(email)
        await ledger.record(
            mid, job_id=ctx.job_id, provider=self.backend.name, provider_id=sent.provider_id
        )
        outcome: dict[str, Any] = {
            "status": "sent",
            "message_id": mid,
            "provider": self.backend.name,
            "provider_id": sent.provider_id,
            "recipients": list(email.recipients),
        }
        if suppressed:
            outcome["suppressed"] = sorted(suppressed)
        if sent.refused:
            outcome["refused"] = sent.refused
            log.warning(
                "mail %s sent, but the server refused %s",
                mid,
                "; ".join(f"{a}: {r}" for a, r in sent.refused.items()),
                extra={"action": "mail.refused", "job_id": ctx.job_id},
            )
        log.info(
            "mail %s sent via %s to %d recipient(s)",
            mid,
            self.backend.name,
            len(email.recipients),
            extra={"action": "mail.sent", "job_id": ctx.job_id},
        )
        return outcome

    async def _resolve(self, email: Email) -> Email:
        """``email`` with every attachment's bytes (read or fetched now)."""
        if all(a.data is not None for a in email.attachments):
            return email
        if any(a.url is not None for a in email.attachments):
            import httpx

            async with httpx.AsyncClient(timeout=60.0, follow_redirects=True) as client:
                atts = [await a.resolve(client) for a in email.attachments]
        else:
            atts = [await a.resolve(None) for a in email.attachments]
        return replace(email, attachments=tuple(atts))

    # -- the suppression list --------------------------------------------------------

    @property
    def suppressions(self) -> Suppressions:
        """The app's suppression list (shared by every process of the app)."""
        return Suppressions(self.app.broker)

    async def asuppress(self, address: str, reason: str = "", *, ttl: float | None = None) -> None:
        """Never send to ``address`` again (until ``unsuppress``, or ``ttl`` seconds)."""
        await self.suppressions.add(address, reason, source="manual", ttl=ttl)

    async def aunsuppress(self, address: str) -> bool:
        """Take ``address`` off the list; False if it was not on it."""
        return await self.suppressions.remove(address)

    async def ais_suppressed(self, address: str) -> bool:
        return await self.suppressions.get(address) is not None

    async def asuppressed(self) -> list[Suppression]:
        """Every suppressed address, with why and since when."""
        return await self.suppressions.all()

    def suppress(self, address: str, reason: str = "", *, ttl: float | None = None) -> None:
        """``asuppress`` for sync callers."""
        self.app._call(self.asuppress(address, reason, ttl=ttl))

    def unsuppress(self, address: str) -> bool:
        return self.app._call(self.aunsuppress(address))

    def is_suppressed(self, address: str) -> bool:
        return self.app._call(self.ais_suppressed(address))

    def suppressed(self) -> list[Suppression]:
        return self.app._call(self.asuppressed())


def _tuple(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
