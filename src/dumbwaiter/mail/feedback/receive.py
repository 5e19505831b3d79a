"""Receivers: a provider's webhook in, ``mail.bounced`` / ``mail.complained`` out.

Each ``receive_<provider>`` parses one webhook request, puts hard bounces
and complainers on the suppression list, then publishes the events, and
returns what it parsed.  Suppression comes first and both steps are
idempotent, so a request that fails half-way (the broker unreachable) can be
answered with an error and retried by the provider.  A retried webhook
publishes its events again: subscribers should be idempotent (suppressing
twice is).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import InvalidEmail
from ..events import MailBounced, MailComplained
from ..suppression import Suppressions
from . import postmark, resend, sendgrid, ses
from .base import Feedback, Parsed, SignatureError

if TYPE_CHECKING:
    from ...app import App

log = logging.getLogger("dumbwaiter.mail")

#: where SNS subscription confirmations may be fetched from (https only)
SNS_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")


async def record(app: App, events: Sequence[Feedback]) -> None:
    """Suppress what must be suppressed, then publish ``events``.  A recipient
    that is not an address (a provider's oddity) is reported, not suppressed:
    failing the request would only make the provider send it again."""
    sup = Suppressions(app.broker)
    for e in events:
        if isinstance(e, MailComplained):
            reason = f"complaint ({e.feedback_type or 'spam'})"
        elif isinstance(e, MailBounced) and e.hard:
            reason = f"hard bounce: {e.reason or e.kind}"
        else:
            continue
        try:
            await sup.add(e.recipient, reason, source=e.provider)
        except InvalidEmail as exc:
            log.warning("%s feedback names no address, not suppressed: %s", e.provider, exc)
    for e in events:
        await app.apublish(e)


async def receive_ses(
    app: App,
    body: bytes,
    *,
    topic_arns: Sequence[str] | None = None,
    confirm_subscriptions: bool = False,
) -> Parsed:
    """An SNS request carrying SES notifications.  ``topic_arns``: accept
    only these topics.  ``confirm_subscriptions``: visit the ``SubscribeURL``
    of a subscription confirmation (only on an ``sns.*.amazonaws.com`` https
    host), else it is logged for a person to visit."""
    parsed = ses.parse(body)
    if topic_arns is not None and parsed.topic_arn not in topic_arns:
        raise SignatureError(f"ses webhook: topic {parsed.topic_arn!r} is not an accepted topic")
    if parsed.subscribe_url:
        await _confirm(parsed.subscribe_url, parsed.topic_arn, confirm_subscriptions)
    await record(app, parsed.events)
    return parsed


async def receive_sendgrid(app: App, body: bytes) -> Parsed:
    """A SendGrid Event Webhook request."""
    parsed = sendgrid.parse(body)
    await record(app, parsed.events)
    return parsed


async def receive_postmark(app: App, body: bytes) -> Parsed:
    """A Postmark bounce or spam complaint webhook request."""
    parsed = postmark.parse(body)
    await record(app, parsed.events)
    return parsed


async def receive_resend(
    app: App, body: bytes, headers: Mapping[str, str], *, secret: str | None
) -> Parsed:
    """A Resend webhook request, its Svix signature checked with ``secret``
    (None skips the check: only behind other authentication)."""
    if secret is not None:
        resend.verify(secret, headers, body)
    parsed = resend.parse(body)
    await record(app, parsed.events)
    return parsed


async def _confirm(url: str, topic: str | None, confirm: bool) -> None:
    parts = urlsplit(url)
    if not confirm or parts.scheme != "https" or not SNS_HOST.match(parts.hostname or ""):
        log.warning(
            "SNS subscription to %s waits for confirmation: visit %s "
            "(confirmed automatically only with confirm_subscriptions=True on an "
            "https sns.<region>.amazonaws.com URL)",
            topic,
            url,
        )
        return
    import httpx

    async with httpx.AsyncClient(timeout=30.0) as client:
        resp = await client.get(url)
    resp.raise_for_status()
    log.info("SNS subscription to %s confirmed", topic)
