"""Postmark's bounce and spam complaint webhooks: one JSON object per request.

``RecordType`` ``Bounce``: ``Type`` ``HardBounce``, ``BadEmailAddress`` and
``ManuallyDeactivated`` are hard, as is any bounce after which Postmark
marked the address ``Inactive`` (it refuses to send there until
reactivated); the others (``SoftBounce``, ``Transient``, ``DnsError``...)
are soft.  ``RecordType`` ``SpamComplaint`` is a complaint.  ``MessageID`` is
Postmark's id; ``Metadata`` carries back what the Postmark backend set
(``dw_id``, ``dw_message_id``).
"""

from __future__ import annotations

from typing import Any

from ..events import MailBounced, MailComplained
from .base import Parsed, load_json, obj, text, when

PROVIDER = "postmark"
HARD_TYPES = frozenset({"HardBounce", "BadEmailAddress", "ManuallyDeactivated"})


def parse(body: bytes | str) -> Parsed:
    doc = obj(load_json(body, PROVIDER), "the body", PROVIDER)
    record = doc.get("RecordType")
    if not doc.get("Email"):
        return Parsed()
    meta: dict[str, Any] = doc["Metadata"] if isinstance(doc.get("Metadata"), dict) else {}
    ids: dict[str, str | None] = {
        "message_id": text(meta.get("dw_message_id")) or None,
        "provider_message_id": text(doc.get("MessageID")) or None,
        "delivery_id": text(meta.get("dw_id")) or None,
    }
    if record == "Bounce":
        btype = text(doc.get("Type"))
        return Parsed(
            events=[
                MailBounced(
                    provider=PROVIDER,
                    recipient=text(doc["Email"]),
                    hard=btype in HARD_TYPES or doc.get("Inactive") is True,
                    kind=btype,
                    reason=text(doc.get("Details") or doc.get("Description")),
                    occurred_at=when(doc.get("BouncedAt")),
                    **ids,
                )
            ]
        )
    if record == "SpamComplaint":
        return Parsed(
            events=[
                MailComplained(
                    provider=PROVIDER,
                    recipient=text(doc["Email"]),
                    feedback_type=text(doc.get("Type")),
                    occurred_at=when(doc.get("BouncedAt")),
                    **ids,
                )
            ]
        )
    return Parsed()
