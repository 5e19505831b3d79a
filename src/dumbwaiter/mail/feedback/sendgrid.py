"""SendGrid's Event Webhook: a JSON array of events.

``bounce`` events carry ``type``: ``bounce`` (permanent: hard) or
``blocked`` (the receiving server refused for now: soft); ``dropped``
events whose ``reason`` is ``Bounced Address`` or ``Invalid`` mean SendGrid
itself refused an address that bounced before (hard); ``spamreport`` is a
complaint.  ``sg_message_id`` is SendGrid's id; the ``custom_args`` the
SendGrid backend sets come back as top-level fields (``dw_id``,
``dw_message_id``).  Other events (delivered, open, deferred...) give none.
"""

from __future__ import annotations

from typing import Any

from ..events import MailBounced, MailComplained
from .base import Feedback, FeedbackError, Parsed, load_json, text, when

PROVIDER = "sendgrid"
#: ``dropped`` reasons that mean the address itself is bad
HARD_DROPS = frozenset({"bounced address", "invalid"})


def parse(body: bytes | str) -> Parsed:
    doc = load_json(body, PROVIDER)
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list):
        raise FeedbackError("sendgrid webhook: the body is not a list of events")
    events: list[Feedback] = []
    for e in doc:
        if isinstance(e, dict) and e.get("email"):
            event = _event(e)
            if event is not None:
                events.append(event)
    return Parsed(events=events)


def _event(e: dict[str, Any]) -> Feedback | None:
    ids: dict[str, str | None] = {
        "message_id": text(e.get("dw_message_id") or e.get("smtp-id")) or None,
        "provider_message_id": text(e.get("sg_message_id")) or None,
        "delivery_id": text(e.get("dw_id")) or None,
    }
    at = when(e.get("timestamp"))
    kind = e.get("event")
    if kind == "bounce":
        btype = text(e.get("type") or "bounce")
        return MailBounced(
            provider=PROVIDER,
            recipient=text(e["email"]),
            hard=btype == "bounce",
            kind=btype,
            reason=" ".join(x for x in (text(e.get("status")), text(e.get("reason"))) if x),
            occurred_at=at,
            **ids,
        )
    if kind == "dropped" and text(e.get("reason")).lower() in HARD_DROPS:
        return MailBounced(
            provider=PROVIDER,
            recipient=text(e["email"]),
            hard=True,
            kind="dropped",
            reason=text(e.get("reason")),
            occurred_at=at,
            **ids,
        )
    if kind == "spamreport":
        return MailComplained(
            provider=PROVIDER,
            recipient=text(e["email"]),
            occurred_at=at,
            message_id=ids["message_id"],
            provider_message_id=ids["provider_message_id"],
            delivery_id=ids["delivery_id"],
        )
    return None
