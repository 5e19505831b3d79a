"""Resend's webhooks (delivered by Svix): ``{"type", "created_at", "data"}``.

``email.bounced`` (data.bounce ``type`` ``Permanent`` is hard, a
``Transient`` or ``Undetermined`` one soft; Resend sends this event for
permanent rejections, so a missing type counts as hard) and
``email.complained`` give one event per address in ``data.to`` (Resend
does not say which recipient of a multi-recipient mail bounced).
``data.email_id`` is Resend's id, ``data.tags`` carry back ``dw_id``.

Requests are signed the Svix way: ``svix-id``, ``svix-timestamp`` and
``svix-signature`` (``v1,<base64 HMAC-SHA256>`` of ``id.timestamp.body``,
keyed with the endpoint's ``whsec_`` secret); ``verify`` checks them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any

from ..events import MailBounced, MailComplained
from .base import Feedback, Parsed, SignatureError, load_json, obj, text, when

PROVIDER = "resend"
#: how far a webhook's timestamp may be from now (seconds), against replays
TOLERANCE = 300.0


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: float | None = None
) -> None:
    """Raise ``SignatureError`` unless ``body`` was signed with ``secret``."""
    h = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, sigs = h.get("svix-id"), h.get("svix-timestamp"), h.get("svix-signature")
    if not msg_id or not stamp or not sigs:
        raise SignatureError(
            "resend webhook: the svix-id/svix-timestamp/svix-signature headers are missing"
        )
    try:
        sent_at = int(stamp)
    except ValueError:
        raise SignatureError(f"resend webhook: bad svix-timestamp {stamp!r}") from None
    if abs((time.time() if now is None else now) - sent_at) > TOLERANCE:
        raise SignatureError("resend webhook: the timestamp is outside the tolerance (a replay?)")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError("resend webhook: the signing secret is not whsec_<base64>") from None
    signed = msg_id.encode() + b"." + stamp.encode() + b"." + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for sig in sigs.split():
        version, _, value = sig.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return
    raise SignatureError("resend webhook: no signature matches")


def parse(body: bytes | str) -> Parsed:
    doc = obj(load_json(body, PROVIDER), "the body", PROVIDER)
    kind = doc.get("type")
    if kind not in ("email.bounced", "email.complained"):
        return Parsed()
    data = obj(doc.get("data"), "data", PROVIDER)
    to = data.get("to")
    recipients = [to] if isinstance(to, str) else [text(a) for a in to or [] if a]
    tags: dict[str, Any] = data["tags"] if isinstance(data.get("tags"), dict) else {}
    ids: dict[str, str | None] = {
        "provider_message_id": text(data.get("email_id")) or None,
        "delivery_id": text(tags.get("dw_id")) or None,
    }
    at = when(doc.get("created_at") or data.get("created_at"))
    events: list[Feedback] = []
    if kind == "email.bounced":
        bounce: dict[str, Any] = data["bounce"] if isinstance(data.get("bounce"), dict) else {}
        btype = text(bounce.get("type"))
        sub = text(bounce.get("subType"))
        for r in recipients:
            events.append(
                MailBounced(
                    provider=PROVIDER,
                    recipient=r,
                    hard=btype in ("", "Permanent"),
                    kind=f"{btype}/{sub}" if sub else btype,
                    reason=text(bounce.get("message")),
                    occurred_at=at,
                    **ids,
                )
            )
    else:
        for r in recipients:
            events.append(
                MailComplained(
                    provider=PROVIDER,
                    recipient=r,
                    occurred_at=at,
                    provider_message_id=ids["provider_message_id"],
                    delivery_id=ids["delivery_id"],
                )
            )
    return Parsed(events=events)
