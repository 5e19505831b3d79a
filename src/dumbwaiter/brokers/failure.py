"""The errors a broker raises when it cannot serve a call, worded for the
person who reads them: which server (password masked, options left off) and
what went wrong, in one line, as the ``BrokerError`` subclass that says
whether trying again can help (errors.py):

* ``unavailable``: not reachable now (refused, timed out, restarting,
  locked): ``BrokerUnavailable``;
* ``refused``: reached, and it refuses the URL for good (credentials, a
  database or vhost that does not exist, a file that is not a database):
  ``BrokerConfigError`` / ``BrokerAuthError``, never retried;
* ``failed``: any other server or client error: ``BrokerError``.

Each broker sorts its client library's exceptions into these (its
``failure`` method); the client's exception stays the ``__cause__``.
"""

from __future__ import annotations

from ..errors import BrokerAuthError, BrokerConfigError, BrokerError, BrokerUnavailable
from ..redact import mask_url


def server_name(url: str) -> str:
    """The server ``url`` names, for a message: its password masked, its
    query (dumbwaiter's and the client's options) left off."""
    return mask_url(url).split("?", 1)[0]


def cause_of(exc: BaseException | str) -> str:
    """An exception's message on one line (its type name if it has none)."""
    text = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
    return " ".join(text.split())


def unavailable(
    url: str, cause: BaseException | str, waited: float | None = None
) -> BrokerUnavailable:
    """The server could not be reached (for ``waited`` seconds, if given)."""
    text = f"{server_name(url)} is unavailable: {cause_of(cause)}"
    if waited is not None:
        text += f" (gave up after {waited:.1f} s)"
    exc = BrokerUnavailable(text)
    exc.server = server_name(url)
    return exc


def refused(url: str, cause: BaseException | str, *, auth: bool = False) -> BrokerConfigError:
    """The server refuses the URL for good: its credentials (``auth``), or
    the database, vhost or file it names."""
    cls = BrokerAuthError if auth else BrokerConfigError
    exc = cls(f"cannot connect to {server_name(url)}: {cause_of(cause)}")
    exc.server = server_name(url)
    return exc


def failed(url: str, cause: BaseException | str, what: str = "") -> BrokerError:
    """Any other failure of a call (``what``: the call, if worth naming)."""
    where = f"{what} on {server_name(url)}" if what else server_name(url)
    exc = BrokerError(f"{where}: {cause_of(cause)}")
    exc.server = server_name(url)
    return exc
