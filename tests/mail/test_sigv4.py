"""The SES adapter's SigV4 signer against AWS's published signing test suite
(aws-sig-v4-test-suite: credentials AKIDEXAMPLE, 2015-08-30T12:36:00Z,
us-east-1, service "service")."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dumbwaiter.mail.backends import sigv4

WHEN = datetime(2015, 8, 30, 12, 36, 0, tzinfo=UTC)
PREFIX = (
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
    "SignedHeaders=host;x-amz-date, Signature="
)


@pytest.mark.parametrize(
    ("name", "method", "url", "signature"),
    [
        ("get-vanilla", "GET", "https://example.amazonaws.com/",
         "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        ("get-vanilla-query-order-key-case", "GET",
         "https://example.amazonaws.com/?Param2=value2&Param1=value1",
         "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
        ("post-vanilla", "POST", "https://example.amazonaws.com/",
         "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
    ],
)  # fmt: skip
def test_the_aws_signing_test_suite(name: str, method: str, url: str, signature: str) -> None:
    added = sigv4.sign(
        method,
        url,
        {},
        b"",
        access_key="AKIDEXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        region="us-east-1",
        service="service",
        now=WHEN,
    )
    assert added["x-amz-date"] == "20150830T123600Z"
    assert added["Authorization"] == PREFIX + signature


def test_a_session_token_is_sent_and_signed() -> None:
    added = sigv4.sign(
        "POST",
        "https://email.eu-west-1.amazonaws.com/v2/email/outbound-emails",
        {"content-type": "application/json"},
        b"{}",
        access_key="AKID",
        secret_key="secret",
        region="eu-west-1",
        service="ses",
        now=WHEN,
        session_token="tok",
    )
    assert added["x-amz-security-token"] == "tok"
    assert (
        "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token," in added["Authorization"]
    )
