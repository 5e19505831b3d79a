"""Query options of broker URLs: declared once per broker, checked at ``App()``.

A broker URL is configuration, and configuration that cannot work should
fail where it is written, not at the first call deep inside a client library
(a typo like ``?prefx=`` used to surface as a redis-py ``TypeError``, or not
at all).  So each broker declares its options in a ``Table``, each with a
type, a default and a line of help, and builds it with ``Table.parse`` in its
constructor: an unknown option, an option given twice, a value of the wrong
kind, a bad port or a missing host raise ``InvalidURL`` naming the option,
what it accepts and, for a typo, the option meant.

Options a broker hands to its client library (libpq's ``sslmode``,
redis-py's ``ssl_ca_certs``...) are declared too, with ``passthrough=True``:
they are checked the same way and stay in the query the library sees
(``Values.client``).  A broker whose library accepts an open-ended set of
keys (libpq) gives ``other_keys``; those pass through unchecked here and are
left to the library's own parser.

Every URL in a message goes through ``mask_url``: the password never shows.
The tables are also what the docs list: a test compares each broker's page
with its table.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl, urlsplit

from ..errors import InvalidURL
from ..redact import MASK, SECRET_PARAMS, mask_url

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Option(Generic[T]):
    """One query option: its name, default, help, and how its text is read."""

    name: str
    default: T
    help: str
    #: turns the query text into the value; raises ValueError if not accepted
    convert: Callable[[str], T]
    #: what ``convert`` accepts, for error messages ("a number of seconds > 0")
    accepts: str
    #: handed to the client library as written (after the check)
    passthrough: bool = False
    #: the URL schemes the option applies to (empty: every scheme of the broker)
    schemes: tuple[str, ...] = ()
    #: how a passthrough value is written for the client library (None: as
    #: given); a flag writes ``1``/``0``, which every client reads the same way
    render: Callable[[T], str] | None = None

    @property
    def shown_default(self) -> str:
        """The default as the docs write it (``3600``, ``false``, ``""``)."""
        d: Any = self.default
        if d is None:
            return ""
        if isinstance(d, bool):
            return "true" if d else "false"
        if isinstance(d, float) and d.is_integer():
            return str(int(d))
        return str(d)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def seconds(
    name: str,
    default: float,
    help: str,
    *,
    positive: bool = False,
    passthrough: bool = False,
    schemes: tuple[str, ...] = (),
) -> Option[float]:
    """A duration in seconds: ``> 0`` when ``positive``, else ``>= 0``."""

    def convert(text: str) -> float:
        value = _finite(text)
        if value < 0 or (positive and value == 0):
            raise ValueError(text)
        return value

    accepts = "a number of seconds " + ("greater than 0" if positive else "of 0 or more")
    return Option(name, default, help, convert, accepts, passthrough, schemes)


def integer(
    name: str,
    default: int,
    help: str,
    *,
    low: int = 0,
    high: int | None = None,
    passthrough: bool = False,
    schemes: tuple[str, ...] = (),
) -> Option[int]:
    """A whole number from ``low`` to ``high`` (inclusive)."""

    def convert(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value

    accepts = (
        f"a whole number from {low} to {high}"
        if high is not None
        else f"a whole number of {low} or more"
    )
    return Option(name, default, help, convert, accepts, passthrough, schemes)


def flag(
    name: str,
    default: bool,
    help: str,
    *,
    passthrough: bool = False,
    schemes: tuple[str, ...] = (),
) -> Option[bool]:
    """A yes/no switch: ``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off``."""

    def convert(text: str) -> bool:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(text)

    accepts = "true or false (also 1/0, yes/no, on/off)"
    return Option(name, default, help, convert, accepts, passthrough, schemes, _one_zero)


def _one_zero(value: bool) -> str:
    return "1" if value else "0"


def choice(
    name: str,
    default: str,
    choices: Sequence[str],
    help: str,
    *,
    passthrough: bool = False,
    schemes: tuple[str, ...] = (),
) -> Option[str]:
    """One of ``choices`` (compared without case; the value is lower-cased)."""
    allowed = tuple(choices)

    def convert(text: str) -> str:
        value = text.lower()
        if value not in allowed:
            raise ValueError(text)
        return value

    accepts = "one of " + ", ".join(allowed)
    return Option(name, default, help, convert, accepts, passthrough, schemes, str)


def text(
    name: str,
    default: T,
    help: str,
    *,
    pattern: str | None = None,
    accepts: str = "any text",
    passthrough: bool = False,
    schemes: tuple[str, ...] = (),
) -> Option[str | T]:
    """Free text, matching ``pattern`` (a full match) when one is given."""
    compiled = re.compile(pattern) if pattern is not None else None

    def convert(value: str) -> str | T:
        if compiled is not None and not compiled.fullmatch(value):
            raise ValueError(value)
        return value

    return Option(name, default, help, convert, accepts, passthrough, schemes)


def custom(
    name: str,
    default: T,
    help: str,
    convert: Callable[[str], T],
    accepts: str,
    *,
    passthrough: bool = False,
    schemes: tuple[str, ...] = (),
) -> Option[T]:
    """An option read by a converter of its own (raising ValueError)."""
    return Option(name, default, help, convert, accepts, passthrough, schemes)


class Values:
    """What ``Table.parse`` read: each declared option's value (its default
    when the URL does not set it) and the query pairs for the client library."""

    __slots__ = ("_values", "client", "given")

    def __init__(
        self, values: dict[str, Any], given: frozenset[str], client: list[tuple[str, str]]
    ) -> None:
        self._values = values
        #: the names the URL sets
        self.given = given
        #: ``(key, value)`` pairs to hand to the client library, in URL order
        self.client = client

    def __getitem__(self, option: Option[T]) -> T:
        value: T = self._values[option.name]
        return value


class Table:
    """The options of one broker's URL (see the module docstring).

    ``label`` names the broker in messages ("redis URL ..."); ``client`` names
    the library passthrough options go to.  ``other_keys`` returns further
    keys the client library accepts and parses itself (pass through
    unchecked); ``others`` says what they are, for the error message.  Hosts:
    ``host_required`` refuses a URL without one, ``several`` allows a
    comma-separated list; ports must be numbers from 1 to 65535.  A table
    with ``check_hosts=False`` leaves the netloc to its broker (SQLite's
    path, memory's name)."""

    def __init__(
        self,
        label: str,
        options: Iterable[Option[Any]],
        *,
        client: str = "",
        other_keys: Callable[[], Collection[str]] | None = None,
        others: str = "",
        check_hosts: bool = True,
        host_required: bool = True,
        several: bool = False,
    ) -> None:
        self.label = label
        self.options: dict[str, Option[Any]] = {}
        for opt in options:
            if opt.name in self.options:
                raise ValueError(f"option {opt.name!r} declared twice")
            self.options[opt.name] = opt
        self.client = client
        self.other_keys = other_keys
        self.others = others
        self.check_hosts = check_hosts
        self.host_required = host_required
        self.several = several

    @property
    def ours(self) -> list[str]:
        """The options dumbwaiter reads itself."""
        return [n for n, o in self.options.items() if not o.passthrough]

    @property
    def passed(self) -> list[str]:
        """The declared options handed to the client library."""
        return [n for n, o in self.options.items() if o.passthrough]

    def parse(self, url: str) -> Values:
        """Check ``url``'s host part and query; raise ``InvalidURL`` naming the problem."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if self.check_hosts:
            self._check_hosts(url, parts.netloc.rpartition("@")[2])
        values = {name: opt.default for name, opt in self.options.items()}
        given: set[str] = set()
        client: list[tuple[str, str]] = []
        other: Collection[str] | None = None
        for key, raw in parse_qsl(parts.query, keep_blank_values=True):
            if key in given:
                raise InvalidURL(f"{self._where(url)}: option {key!r} is given twice")
            given.add(key)
            opt = self.options.get(key)
            if opt is None:
                if other is None:
                    other = self.other_keys() if self.other_keys is not None else ()
                if key in other:
                    client.append((key, raw))
                    continue
                raise InvalidURL(self._unknown(url, key, other))
            if opt.schemes and scheme not in opt.schemes:
                only = ", ".join(f"{s}://" for s in opt.schemes)
                raise InvalidURL(f"{self._where(url)}: option {key!r} applies to {only} only")
            try:
                value = values[key] = opt.convert(raw)
            except ValueError:
                shown = MASK if SECRET_PARAMS.search(key) else repr(raw)
                raise InvalidURL(
                    f"{self._where(url)}: {key}={shown} is not accepted; {key} takes "
                    f"{opt.accepts} (default {opt.shown_default or 'unset'})"
                ) from None
            if opt.passthrough:
                client.append((key, raw if opt.render is None else opt.render(value)))
        return Values(values, frozenset(given), client)

    def _where(self, url: str) -> str:
        return f"{self.label} URL {mask_url(url)!r}"

    def _unknown(self, url: str, key: str, other: Collection[str]) -> str:
        known = list(self.options) + sorted(other)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        msg = f"unknown option {key!r} in {self._where(url)}. "
        if close:
            msg += f"Did you mean {close[0]!r}? "
        msg += "Known options: " + (", ".join(self.ours) or "none")
        if self.passed:
            msg += f"; passed to {self.client}: " + ", ".join(self.passed)
        if self.others:
            msg += f"; and {self.others}"
        return msg + "."

    def _check_hosts(self, url: str, hostinfo: str) -> None:
        if not hostinfo:
            if self.host_required:
                raise InvalidURL(f"{self._where(url)} names no host")
            return
        for one in hostinfo.split(",") if self.several else [hostinfo]:
            host, port = _split_host(one)
            if self.host_required and not host:
                raise InvalidURL(f"{self._where(url)}: empty host in {hostinfo!r}")
            if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
                raise InvalidURL(
                    f"{self._where(url)}: port {port!r} is not a number from 1 to 65535"
                )


def _split_host(hostport: str) -> tuple[str, str | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host, port or None)."""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            return hostport, None
        rest = hostport[end + 1 :]
        return hostport[: end + 1], rest[1:] if rest.startswith(":") else (rest or None)
    host, sep, port = hostport.rpartition(":")
    return (host, port) if sep else (hostport, None)


__all__ = [
    "Option",
    "Table",
    "Values",
    "choice",
    "custom",
    "flag",
    "integer",
    "seconds",
    "text",
]
