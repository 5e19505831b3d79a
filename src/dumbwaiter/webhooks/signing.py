"""Standard Webhooks signatures: ``sign`` for senders, ``verify`` for receivers.

The signed content is ``{msg_id}.{timestamp}.{payload}`` and a signature is
``v1,`` + base64(HMAC-SHA256(secret, content)); the ``webhook-signature``
header is a space-separated list of them, so a sender can sign with the new
and the old secret while an endpoint's secret is rotated.  The HMAC itself is
the reference package's (``standardwebhooks.Webhook.sign``): one
implementation of the scheme, checked against the specification's vectors by
its authors and by our tests.

``verify`` is ours rather than the package's ``Webhook.verify``, for three
reasons a receiver meets: the tolerance is a parameter (the package fixes
five minutes), a malformed header raises ``WebhookVerificationError``
(the package lets ``ValueError`` and ``binascii.Error`` escape from a
signature without a comma or with bad base64), and ``now`` can be given, so
the published vectors, signed in 2021, can be checked.

Only ``v1`` (HMAC-SHA256) is supported: the reference package has no
Ed25519 (``v1a``); a ``v1a`` signature in a header is skipped, as the
specification asks of unknown versions.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets as _secrets
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from standardwebhooks import Webhook

from ..errors import ConfigurationError, DumbwaiterError

#: a receiver accepts timestamps this far from its clock, either way (seconds)
DEFAULT_TOLERANCE = 300.0
#: the prefix of a serialized HMAC secret
SECRET_PREFIX = "whsec_"
#: HMAC secrets hold 24 to 64 random bytes (the specification's range)
MIN_SECRET_BYTES, MAX_SECRET_BYTES = 24, 64


class WebhookVerificationError(DumbwaiterError, ValueError):
    """A webhook failed verification: a header is missing or malformed, its
    timestamp is outside the tolerance, or no signature matches."""


def new_secret(nbytes: int = 32) -> str:
    """A fresh HMAC secret, ``whsec_`` + base64 of ``nbytes`` random bytes."""
    if not MIN_SECRET_BYTES <= nbytes <= MAX_SECRET_BYTES:
        raise ConfigurationError(
            f"a secret holds {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, got {nbytes}"
        )
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(nbytes)).decode()


def check_secret(secret: str) -> str:
    """``secret`` if it is a usable HMAC secret (``whsec_`` + base64 of 24-64
    bytes; the prefix may be left out), else ``ConfigurationError`` naming why."""
    if not isinstance(secret, str) or not secret:
        raise ConfigurationError(f"a webhook secret is a 'whsec_...' string, got {secret!r}")
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw + "==", validate=False)
    except (binascii.Error, ValueError):
        raise ConfigurationError(
            "the webhook secret is not base64 after 'whsec_' (make one with new_secret())"
        ) from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ConfigurationError(
            f"the webhook secret decodes to {len(key)} bytes; the specification asks for "
            f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} (make one with new_secret())"
        )
    return secret


def _signer(secret: str | bytes) -> Webhook:
    try:
        return Webhook(secret)
    except Exception as exc:  # EmptyWebhookSecretError, binascii.Error
        raise ConfigurationError(f"unusable webhook secret: {exc}") from None


def _check_part(value: str, what: str) -> str:
    if not value or "." in value:
        raise ConfigurationError(f"{what} must be non-empty and hold no '.', got {value!r}")
    return value


def sign(
    secret: str | bytes | Iterable[str | bytes],
    msg_id: str,
    timestamp: int | float | datetime,
    payload: bytes | str,
) -> str:
    """The ``webhook-signature`` header value for ``payload`` sent as message
    ``msg_id`` at ``timestamp`` (epoch seconds or an aware datetime).

    Several secrets (current and previous, while rotating) give several
    signatures, space-separated; a receiver accepts the message if any of
    them verifies with the secret it holds."""
    _check_part(msg_id, "msg_id")
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise ConfigurationError("timestamp is a naive datetime; pass an aware one")
        seconds = int(timestamp.timestamp())
    else:
        seconds = int(timestamp)
    when = datetime.fromtimestamp(seconds, tz=UTC)
    text = payload.decode() if isinstance(payload, bytes) else payload
    keys = [secret] if isinstance(secret, str | bytes) else list(secret)
    if not keys:
        raise ConfigurationError("sign needs at least one secret")
    return " ".join(_signer(k).sign(msg_id, when, text) for k in keys)


def verify(
    secret: str | bytes | Iterable[str | bytes],
    headers: Mapping[str, str],
    payload: bytes | str,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    now: float | None = None,
) -> None:
    """Check a received webhook; raise ``WebhookVerificationError`` unless it
    is authentic and fresh.

    ``headers`` are the request's (any case); ``payload`` is the raw body,
    exactly as received (parse it after verifying, never before: JSON
    re-encoded is not the bytes that were signed).  The timestamp must be
    within ``tolerance`` seconds of ``now`` (default: this machine's clock),
    so a captured request cannot be replayed later; de-duplicate on
    ``webhook-id`` as well, since one message may arrive more than once.
    ``secret`` may be several (during a rotation): any one that verifies is
    enough."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    stamp = lower.get("webhook-timestamp")
    header = lower.get("webhook-signature")
    if not (msg_id and stamp and header):
        missing = [
            h for h in ("webhook-id", "webhook-timestamp", "webhook-signature") if not lower.get(h)
        ]
        raise WebhookVerificationError(f"missing header(s): {', '.join(missing)}")
    try:
        seconds = int(stamp)
    except ValueError:
        raise WebhookVerificationError(f"webhook-timestamp {stamp!r} is not an integer") from None
    clock = time.time() if now is None else now
    if seconds < clock - tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp {seconds} is {clock - seconds:.0f} s old "
            f"(tolerance {tolerance:g} s)"
        )
    if seconds > clock + tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp {seconds} is {seconds - clock:.0f} s in the future "
            f"(tolerance {tolerance:g} s)"
        )
    if isinstance(payload, bytes):
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            raise WebhookVerificationError("the payload is not UTF-8 text") from None
    else:
        text = payload
    passed = []
    for part in header.split():
        version, sep, sig = part.partition(",")
        if not sep or version != "v1":
            continue  # another scheme (v1a) or junk: not ours to judge
        try:
            passed.append(base64.b64decode(sig, validate=True))
        except (binascii.Error, ValueError):
            continue
    keys = [secret] if isinstance(secret, str | bytes) else list(secret)
    when = datetime.fromtimestamp(seconds, tz=UTC)
    for key in keys:
        expected = base64.b64decode(_signer(key).sign(msg_id, when, text).partition(",")[2])
        if any(hmac.compare_digest(expected, p) for p in passed):
            return
    raise WebhookVerificationError("no signature matches (wrong secret, or a changed payload)")
