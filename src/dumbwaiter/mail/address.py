"""E-mail addresses: checked when a mail is composed, normalized for the
suppression list.

Checking happens at the call, so a typo in a recipient fails the code that
wrote it instead of a worker an hour later.  The check is deliberately
modest (one ``@``, no spaces or line breaks, a dot-free-or-dotted domain):
the server is the judge of the rest, and its 5xx reply dead-letters the job.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from email.utils import formataddr, getaddresses, parseaddr

from .errors import InvalidEmail

_ADDR = re.compile(r"^[^@\s<>\"(),;:]+@[^@\s<>\"(),;:\[\]]+$")


def check_address(value: str, what: str) -> str:
    """``value`` (``"a@b.c"`` or ``"Name <a@b.c>"``) as it will be sent, or
    ``InvalidEmail`` naming ``what`` (``"to"``, ``"sender"``...)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidEmail(f"{what}: expected an e-mail address, got {value!r}")
    if "\r" in value or "\n" in value:
        raise InvalidEmail(f"{what}: {value!r} contains a line break")
    pairs = getaddresses([value])
    if len(pairs) != 1:
        raise InvalidEmail(f"{what}: {value!r} holds {len(pairs)} addresses; give a list")
    name, addr = pairs[0]
    if not _ADDR.match(addr):
        raise InvalidEmail(f"{what}: {value!r} is not an e-mail address")
    return formataddr((name, addr)) if name else addr


def check_addresses(values: str | Iterable[str] | None, what: str) -> tuple[str, ...]:
    """A list (or one address) of ``check_address``."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    return tuple(check_address(v, what) for v in values)


def bare(value: str) -> str:
    """The address alone, lower-cased: the key of the suppression list
    (``"Ann <Ann@Example.com>"`` and ``"ann@example.com"`` are one recipient)."""
    return parseaddr(value)[1].strip().lower()


def domain_of(value: str) -> str:
    """The domain part of an address (for Message-IDs)."""
    return bare(value).rpartition("@")[2]
