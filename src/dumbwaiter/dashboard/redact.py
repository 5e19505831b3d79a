"""Secrets never shown: passwords in broker URLs, and webhook secrets.

Broker URLs carry credentials (``postgresql://app:s3cret@db/app``,
``redis://:token@cache``).  Every place the dashboard, the alerts or the
doctor print a URL goes through ``mask_url``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

MASK = "***"

#: query parameters that hold a secret in the URLs of common engines and webhooks
SECRET_PARAMS = re.compile(r"pass|secret|token|key|auth|sig|credential", re.IGNORECASE)


def mask_url(url: str, *, path: bool = False) -> str:
    """``url`` with its password (and secret-looking query values) replaced by
    ``***``.  ``path=True`` also hides the path and query entirely, for webhook
    URLs whose secret is the path itself (``/services/T000/B000/XXXX``).
    Anything that does not parse as a URL is masked whole."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user, sep, _password = userinfo.partition(":")
            netloc = f"{user}:{MASK}@{host}" if sep else f"{MASK}@{host}"
        if path:
            hidden = "/" + MASK if (parts.path.strip("/") or parts.query) else ""
            return f"{parts.scheme}://{netloc}{hidden}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(k, MASK if SECRET_PARAMS.search(k) else v) for k, v in pairs], safe="*/:"
            )
    except ValueError:
        return MASK
    # rebuild by replacing the parts, so ``sqlite:///path`` keeps its three slashes
    out = url
    if netloc != parts.netloc:
        out = out.replace(parts.netloc, netloc, 1)
    if query != parts.query:
        out = out.replace("?" + parts.query, "?" + query, 1)
    return out


def secrets_of(url: str) -> list[str]:
    """The secret parts of ``url`` (its password, secret query values), for
    tests and log filters that must make sure none of them leaks."""
    out: list[str] = []
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    if parts.password:
        out.append(parts.password)
    for k, v in parse_qsl(parts.query, keep_blank_values=False):
        if SECRET_PARAMS.search(k) and v:
            out.append(v)
    return out
