"""What the provider backends share: one pooled httpx client per event loop,
the request, and the mapping of an HTTP answer to the job's fate.

Each provider adapter says how to build its request (``request``), where its
message id is in a success (``accepted``), and which of its errors are
transient (``transient``).  The common rules: a 2xx is sent; 429 is
throttled (retried after ``Retry-After`` when the provider says, else by the
policy); 408 and 5xx are transient; any other 4xx is permanent and
dead-letters the job with the provider's own error text.  A request that
times out or cannot connect is transient.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import email.utils
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import MailDeferred, MailError, MailRejected, MailThrottled
from ..message import Email
from .base import Backend, Sent

try:
    import httpx
except ImportError as exc:  # pragma: no cover - the extra is missing
    from ...errors import MissingDependency

    raise MissingDependency(
        "provider backends need httpx, which is not installed: pip install 'dumbwaiter[mail]'"
    ) from exc

#: the longest ``Retry-After`` honoured (seconds); a longer one is clamped so
#: a provider's "come back tomorrow" still leaves the job's attempts to count
MAX_RETRY_AFTER = 6 * 3600.0


@dataclass(slots=True)
class _Pool:
    client: httpx.AsyncClient
    users: int = 0


@dataclass(slots=True)
class Request:
    """One HTTP request to a provider."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None


class HTTPBackend(Backend):
    """Base of the provider adapters (``SES``, ``SendGrid``, ``Postmark``, ``Resend``)."""

    #: the API's base URL; tests and regional endpoints pass ``base_url=``
    default_base_url = ""

    def __init__(self, *, base_url: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = (base_url or self.default_base_url).rstrip("/")
        self.timeout = timeout
        #: per event loop: its client and how many sends are using it
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url}>"

    async def send(self, email: Email) -> Sent:
        req = self.request(email)
        async with self._client() as client:
            try:
                resp = await client.request(
                    req.method, req.url, headers=req.headers, json=req.json, content=req.content
                )
            except httpx.TimeoutException as exc:
                raise MailDeferred(f"{self.name}: the request timed out ({exc!r})") from None
            except httpx.HTTPError as exc:
                raise MailDeferred(f"{self.name}: the request failed ({exc!r})") from None
        if 200 <= resp.status_code < 300:
            return Sent(provider_id=self.accepted(resp))
        raise self.refused(resp)

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[httpx.AsyncClient]:
        """The running loop's client, shared by the sends in flight (their
        connections are pooled) and closed when the last of them ends, so an
        idle worker holds no connection and nothing is left open at exit.
        A client's connections belong to the loop that opened them: another
        loop gets its own."""
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = self._pools[loop] = _Pool(
                httpx.AsyncClient(timeout=self.timeout, limits=httpx.Limits(max_connections=100))
            )
        pool.users += 1
        try:
            yield pool.client
        finally:
            pool.users -= 1
            if pool.users == 0:
                del self._pools[loop]
                await pool.client.aclose()

    # -- what each provider says ------------------------------------------------

    @abc.abstractmethod
    def request(self, email: Email) -> Request:
        """The request that sends ``email``."""

    @abc.abstractmethod
    def accepted(self, resp: httpx.Response) -> str:
        """The provider's id of the message from a 2xx answer."""

    def error_text(self, resp: httpx.Response) -> str:
        """The provider's explanation in an error answer (its JSON, or the
        start of the body)."""
        return resp.text[:500]

    def transient(self, resp: httpx.Response) -> bool | None:
        """Whether an error answer is transient by the provider's own error
        code (True / False), or None to go by the status code alone."""
        return None

    def refused(self, resp: httpx.Response) -> MailError:
        """The mail error an error answer means."""
        status = resp.status_code
        reason = f"{self.name} answered {status}: {self.error_text(resp)}"
        verdict = self.transient(resp)
        if verdict is None:
            verdict = status in (408, 429) or status >= 500
        if not verdict:
            return MailRejected(reason, code=status)
        after = retry_after(resp)
        if after is not None:
            return MailThrottled(reason, after, code=status)
        return MailDeferred(reason, code=status)


def retry_after(resp: httpx.Response) -> float | None:
    """Seconds the ``Retry-After`` header asks for (delay or HTTP date), clamped
    to ``MAX_RETRY_AFTER``; None when absent or unreadable."""
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def json_or_none(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None
