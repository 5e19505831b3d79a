"""AWS Signature Version 4 for one HTTP request (what SES's API requires).

Small and dependency-free, so the SES adapter needs no boto3: the canonical
request, the string to sign, the derived key and the ``Authorization``
header, as AWS's SigV4 documentation defines them.  Checked against AWS's
published signing test suite (tests/mail/test_sigv4.py).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import parse_qsl, quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _canonical_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(pairs))


def sign(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    access_key: str,
    secret_key: str,
    region: str,
    service: str,
    now: datetime,
    session_token: str | None = None,
) -> dict[str, str]:
    """The headers to add to the request (``x-amz-date``, ``x-amz-content-sha256``
    where wanted, ``x-amz-security-token`` with a session token, and
    ``Authorization``).  ``headers`` are the request's own; ``host`` and every
    ``x-amz-*`` header are signed.  ``now`` must be UTC."""
    parts = urlsplit(url)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    signed_src = {k.lower(): " ".join(v.strip().split()) for k, v in headers.items()}
    signed_src["host"] = parts.netloc
    signed_src["x-amz-date"] = amz_date
    added = {"x-amz-date": amz_date}
    if session_token:
        signed_src["x-amz-security-token"] = session_token
        added["x-amz-security-token"] = session_token
    names = sorted(
        n for n in signed_src if n == "host" or n.startswith("x-amz-") or n == "content-type"
    )
    canonical_headers = "".join(f"{n}:{signed_src[n]}\n" for n in names)
    signed_headers = ";".join(names)
    payload_hash = hashlib.sha256(body).hexdigest()
    path = quote(parts.path or "/", safe="/-_.~%")
    canonical = "\n".join(
        [
            method.upper(),
            path,
            _canonical_query(parts.query),
            canonical_headers,
            signed_headers,
            payload_hash,
        ]
    )
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        [ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signature = hmac.new(
        signing_key(secret_key, date, region, service), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    added["Authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{scope}, "
        f"SignedHeaders={signed_headers}, Signature={signature}"
    )
    return added
