"""Secrets never shown: passwords in broker URLs, and webhook secrets.

Broker URLs carry credentials (``postgresql://app:s3cret@db/app``,
``redis://:token@cache``).  Every place that shows a URL (``repr`` of the App
and of brokers, error messages, log lines, the CLI, the dashboard, alerts)
goes through ``mask_url``, so there is one rule for what is hidden: the
password, secret-looking query values, and the same inside a URL carried as
a query value (RabbitMQ's ``?state=``).  The user name stays: it tells an
operator which account a process uses and is not a secret.

This module imports nothing of dumbwaiter's, so the core, the CLI and the
dashboard can all use it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

MASK = "***"

#: query parameters that hold a secret in the URLs of common engines and webhooks
SECRET_PARAMS = re.compile(r"pass|secret|token|key|auth|sig|credential", re.IGNORECASE)


def mask_url(url: str, *, path: bool = False) -> str:
    """``url`` with its password (and secret-looking query values) replaced by
    ``***``; the user name is kept.  ``path=True`` also hides the path and
    query entirely, for webhook URLs whose secret is the path itself
    (``/services/T000/B000/XXXX``).  Anything that does not parse as a URL is
    masked whole."""
    if "://" not in url and "@" in url:  # a URL without its scheme: ``user:pw@host``
        userinfo, _, host = url.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        return f"{user}:{MASK}@{host}" if sep else url
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user, sep, _password = userinfo.partition(":")
            if sep:
                netloc = f"{user}:{MASK}@{host}"
        if path:
            hidden = "/" + MASK if (parts.path.strip("/") or parts.query) else ""
            return f"{parts.scheme}://{netloc}{hidden}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            masked = [(k, _mask_value(k, v)) for k, v in pairs]
            if masked != pairs:
                query = urlencode(masked, safe="*/:@?")
    except ValueError:
        return MASK
    # rebuild by replacing the parts, so ``sqlite:///path`` keeps its three slashes
    out = url
    if netloc != parts.netloc:
        out = out.replace(parts.netloc, netloc, 1)
    if query != parts.query:
        out = out.replace("?" + parts.query, "?" + query, 1)
    return out


def _mask_value(key: str, value: str) -> str:
    if SECRET_PARAMS.search(key):
        return MASK
    if "://" in value:  # a URL inside a URL (``?state=redis://u:pw@...``)
        return mask_url(value)
    return value


def secrets_of(url: str) -> list[str]:
    """The secret parts of ``url`` (its password, secret query values, and
    those of URLs in its query), for tests and log filters that must make
    sure none of them leaks."""
    out: list[str] = []
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return [url]
    if password:
        out.append(password)
    for k, v in parse_qsl(parts.query, keep_blank_values=False):
        if SECRET_PARAMS.search(k) and v:
            out.append(v)
        elif "://" in v:
            out.extend(secrets_of(v))
    return out
