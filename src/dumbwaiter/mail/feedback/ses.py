"""Amazon SES bounce and complaint notifications, delivered by SNS over HTTP(S).

SNS posts a JSON envelope: ``Type`` ``SubscriptionConfirmation`` (confirm
by visiting ``SubscribeURL``), ``Notification`` (the SES notification is the
JSON text in ``Message``) or ``UnsubscribeConfirmation``.  With raw message
delivery the body is the SES notification itself.  SES writes
``notificationType`` (identity notifications) or ``eventType`` (configuration
set event publishing): ``Bounce`` has ``bounce.bounceType`` (``Permanent``
is hard; ``Transient`` and ``Undetermined`` are soft) and
``bounce.bouncedRecipients``; ``Complaint`` has ``complaint.complainedRecipients``
and ``complaintFeedbackType``.  Other types (``Delivery``, ``Send``...) give
no event.
"""

from __future__ import annotations

from typing import Any

from ..events import MailBounced, MailComplained
from .base import Feedback, FeedbackError, Parsed, load_json, obj, text, when

PROVIDER = "ses"


def parse(body: bytes | str) -> Parsed:
    doc = obj(load_json(body, PROVIDER), "the body", PROVIDER)
    topic = doc.get("TopicArn")
    kind = doc.get("Type")
    if kind == "SubscriptionConfirmation":
        return Parsed(subscribe_url=text(doc.get("SubscribeURL")) or None, topic_arn=topic)
    if kind == "UnsubscribeConfirmation":
        return Parsed(topic_arn=topic)
    if kind == "Notification":
        message = obj(load_json(text(doc.get("Message")), PROVIDER), "Message", PROVIDER)
    elif kind is None:
        message = doc  # raw message delivery: the SES notification itself
    else:
        raise FeedbackError(f"ses webhook: unknown SNS message type {kind!r}")
    return Parsed(events=notification(message), topic_arn=topic)


def notification(message: dict[str, Any]) -> list[Feedback]:
    """The events of one SES notification."""
    kind = message.get("notificationType") or message.get("eventType")
    mail = message.get("mail") if isinstance(message.get("mail"), dict) else {}
    assert isinstance(mail, dict)
    ids: dict[str, str | None] = {
        "message_id": _header(mail, "Message-ID"),
        "provider_message_id": text(mail.get("messageId")) or None,
        "delivery_id": _tag(mail, "dw_id"),
    }
    if kind == "Bounce":
        b = obj(message.get("bounce"), "bounce", PROVIDER)
        btype = text(b.get("bounceType"))
        sub = text(b.get("bounceSubType"))
        return [
            MailBounced(
                provider=PROVIDER,
                recipient=text(r.get("emailAddress")),
                hard=btype == "Permanent",
                kind=f"{btype}/{sub}" if sub else btype,
                reason=text(r.get("diagnosticCode") or r.get("status") or sub),
                occurred_at=when(b.get("timestamp")),
                **ids,
            )
            for r in b.get("bouncedRecipients") or []
            if isinstance(r, dict) and r.get("emailAddress")
        ]
    if kind == "Complaint":
        c = obj(message.get("complaint"), "complaint", PROVIDER)
        return [
            MailComplained(
                provider=PROVIDER,
                recipient=text(r.get("emailAddress")),
                feedback_type=text(c.get("complaintFeedbackType")),
                occurred_at=when(c.get("timestamp")),
                **ids,
            )
            for r in c.get("complainedRecipients") or []
            if isinstance(r, dict) and r.get("emailAddress")
        ]
    return []


def _header(mail: dict[str, Any], name: str) -> str | None:
    common = mail.get("commonHeaders")
    if isinstance(common, dict) and name == "Message-ID" and common.get("messageId"):
        return text(common["messageId"])
    for h in mail.get("headers") or []:
        if isinstance(h, dict) and text(h.get("name")).lower() == name.lower():
            return text(h.get("value")) or None
    return None


def _tag(mail: dict[str, Any], name: str) -> str | None:
    tags = mail.get("tags")
    if isinstance(tags, dict):
        values = tags.get(name)
        if isinstance(values, list) and values:
            return text(values[0])
    return None
