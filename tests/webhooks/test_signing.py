"""``sign`` and ``verify`` against the Standard Webhooks test vectors.

The vectors are the ones the specification's reference libraries test
with: standard-webhooks/standard-webhooks, libraries/python/tests/
test_webhooks.py (``test_sign_function``: the secret, message id,
timestamp, payload and expected signature below;
``test_invalid_signature_raises_error``: the same signature with its last
byte changed; ``test_multi_sig_payload_is_valid``: a header of several
signatures, one valid).  The same vector is in the Go, JavaScript and Ruby
libraries' tests of that repository.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dumbwaiter.errors import ConfigurationError
from dumbwaiter.webhooks import WebhookVerificationError, check_secret, new_secret, sign, verify

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
PAYLOAD = '{"test": 2432232314}'
SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
#: ``test_invalid_signature_raises_error``: one base64 character off
BAD_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="


def headers(signature: str = SIGNATURE, ts: int = TIMESTAMP) -> dict[str, str]:
    return {"webhook-id": MSG_ID, "webhook-timestamp": str(ts), "webhook-signature": signature}


def test_sign_gives_the_published_signature() -> None:
    assert sign(SECRET, MSG_ID, TIMESTAMP, PAYLOAD) == SIGNATURE
    assert sign(SECRET, MSG_ID, TIMESTAMP, PAYLOAD.encode()) == SIGNATURE
    when = datetime.fromtimestamp(TIMESTAMP, tz=UTC)
    assert sign(SECRET, MSG_ID, when, PAYLOAD) == SIGNATURE
    # the secret without its prefix is the same key
    assert sign(SECRET.removeprefix("whsec_"), MSG_ID, TIMESTAMP, PAYLOAD) == SIGNATURE


def test_sign_with_several_secrets_lists_every_signature() -> None:
    other = new_secret()
    header = sign([SECRET, other], MSG_ID, TIMESTAMP, PAYLOAD)
    first, second = header.split(" ")
    assert first == SIGNATURE and second.startswith("v1,") and second != SIGNATURE


def test_verify_accepts_the_published_vector_within_the_tolerance() -> None:
    verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP)
    verify(SECRET, headers(), PAYLOAD.encode(), now=TIMESTAMP + 299)
    # header names in any case, as HTTP frameworks hand them over
    verify(SECRET, {k.upper(): v for k, v in headers().items()}, PAYLOAD, now=TIMESTAMP)


def test_verify_accepts_a_header_of_several_signatures_with_one_valid() -> None:
    sigs = [
        "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
        "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
        SIGNATURE,
        "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
    ]
    verify(SECRET, headers(" ".join(sigs)), PAYLOAD, now=TIMESTAMP)
    # a rotation: the receiver holds the old and the new secret
    verify([new_secret(), SECRET], headers(), PAYLOAD, now=TIMESTAMP)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda h, p: (h | {"webhook-signature": BAD_SIGNATURE}, p), "no signature matches"),
        (lambda h, p: (h, p.replace("2432232314", "2432232315")), "no signature matches"),
        (lambda h, p: (h | {"webhook-id": "msg_other"}, p), "no signature matches"),
        (lambda h, p: (h | {"webhook-signature": "v1a," + SIGNATURE[3:]}, p), "no signature"),
        (lambda h, p: (h | {"webhook-signature": "garbage"}, p), "no signature matches"),
        (lambda h, p: (h | {"webhook-signature": "v1,@@@"}, p), "no signature matches"),
        (lambda h, p: ({k: v for k, v in h.items() if k != "webhook-id"}, p), "webhook-id"),
        (lambda h, p: (h | {"webhook-timestamp": "hello"}, p), "not an integer"),
    ],
)
def test_verify_refuses_a_bad_signature_or_header(change, match) -> None:  # type: ignore[no-untyped-def]
    h, p = change(headers(), PAYLOAD)
    with pytest.raises(WebhookVerificationError, match=match):
        verify(SECRET, h, p, now=TIMESTAMP)


def test_verify_refuses_a_timestamp_outside_the_tolerance() -> None:
    with pytest.raises(WebhookVerificationError, match="old"):
        verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP + 301)
    with pytest.raises(WebhookVerificationError, match="future"):
        verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP - 301)
    with pytest.raises(WebhookVerificationError, match="old"):
        verify(SECRET, headers(), PAYLOAD, now=TIMESTAMP + 31, tolerance=30)
    with pytest.raises(WebhookVerificationError, match="old"):  # the default: this clock
        verify(SECRET, headers(), PAYLOAD)


def test_secrets_are_checked_at_the_call() -> None:
    assert check_secret(new_secret()).startswith("whsec_")
    with pytest.raises(ConfigurationError, match="bytes"):
        check_secret("whsec_c2hvcnQ=")  # 5 bytes
    with pytest.raises(ConfigurationError, match=r"no '\.'"):
        sign(SECRET, "msg.1", TIMESTAMP, PAYLOAD)
