"""The endpoint registry: where webhooks go, kept in the broker's kv store.

Every producer, worker and dashboard on every host reads the same registry
through the broker they already share (``kv_*`` at the seam), so an endpoint
added by a web request, disabled by a 410 in a worker, or re-enabled from
the dashboard is seen by all of them at once, with no server of its own.

One key per endpoint (``webhooks:ep:ID``, a JSON object); a change is a
``kv_update`` of that key, so two processes changing one endpoint at once
(a 410 disabling it while an operator edits its rate limit) both land.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from .. import keys
from ..errors import ConfigurationError, DumbwaiterError
from ..flow import parse_rate
from ..message import check_json, uuid7
from ..redact import mask_url
from .signing import check_secret, new_secret

if TYPE_CHECKING:
    from ..brokers.base import Broker, KvWrite

#: kv key prefix of the registry
PREFIX = keys.WEBHOOK_ENDPOINT
_ID_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
#: ``domain.action``, as ``dw.Event`` types are (event.TYPE_RULE, without importing pydantic)
_TYPE_RULE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


class EndpointNotFound(DumbwaiterError, LookupError):
    """No endpoint with this id is registered."""


class EndpointDisabled(DumbwaiterError):
    """The endpoint is disabled (by an operator, or by a 410 Gone); enable it first."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A registered receiver of webhooks.

    ``event_types`` empty: every event type forwarded to webhooks.
    ``rate_limit`` (``"10/s"`` or ``(n, seconds)``) and ``concurrency`` bound
    what all workers together send to it; ``secrets`` are the current secret
    first, then previous ones still signed with during a rotation (until
    ``secrets_until`` of each)."""

    id: str
    url: str
    secret: str
    event_types: tuple[str, ...] = ()
    rate_limit: tuple[int, float] | None = None
    concurrency: int | None = None
    description: str = ""
    disabled: bool = False
    disabled_reason: str = ""
    disabled_at: float | None = None
    created_at: float = 0.0
    #: previous secrets and when each stops being used: [(secret, until)]
    old_secrets: tuple[tuple[str, float], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        state = " disabled" if self.disabled else ""
        return f"<Endpoint {self.id} {mask_url(self.url)}{state}>"

    def subscribes(self, event_type: str) -> bool:
        return not self.event_types or event_type in self.event_types

    def signing_secrets(self, now: float | None = None) -> list[str]:
        """The current secret, then any previous one still within its rotation window."""
        t = time.time() if now is None else now
        return [self.secret, *(s for s, until in self.old_secrets if until > t)]

    def to_dict(self, *, secrets: bool = False) -> dict[str, Any]:
        """JSON-ready; secrets left out unless asked for (pages and logs never show them)."""
        d: dict[str, Any] = {
            "id": self.id,
            # a partner's URL often carries a token in its path or query
            "url": self.url if secrets else mask_url(self.url, path=True),
            "event_types": list(self.event_types),
            "rate_limit": list(self.rate_limit) if self.rate_limit else None,
            "concurrency": self.concurrency,
            "description": self.description,
            "disabled": self.disabled,
            "disabled_reason": self.disabled_reason,
            "disabled_at": self.disabled_at,
            "created_at": self.created_at,
            "metadata": self.metadata,
        }
        if secrets:
            d["secret"] = self.secret
            d["old_secrets"] = [list(p) for p in self.old_secrets]
        return d

    def encode(self) -> bytes:
        return orjson.dumps(self.to_dict(secrets=True))

    @classmethod
    def decode(cls, raw: bytes) -> Endpoint:
        d = orjson.loads(raw)
        rate = d.get("rate_limit")
        return cls(
            id=d["id"],
            url=d["url"],
            secret=d["secret"],
            event_types=tuple(d.get("event_types") or ()),
            rate_limit=(int(rate[0]), float(rate[1])) if rate else None,
            concurrency=d.get("concurrency"),
            description=d.get("description", ""),
            disabled=bool(d.get("disabled", False)),
            disabled_reason=d.get("disabled_reason", ""),
            disabled_at=d.get("disabled_at"),
            created_at=float(d.get("created_at", 0.0)),
            old_secrets=tuple((str(s), float(u)) for s, u in d.get("old_secrets") or ()),
            metadata=dict(d.get("metadata") or {}),
        )


def key_of(endpoint_id: str) -> str:
    return PREFIX + endpoint_id


def check_url(url: str) -> str:
    """An absolute http(s) URL with a host; anything else fails at the call."""
    if not isinstance(url, str):
        raise ConfigurationError(f"an endpoint URL is a string, got {url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"endpoint URL {mask_url(url)!r} does not parse: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            f"endpoint URL {mask_url(url)!r} must be http:// or https:// with a host"
        )
    if port == 0:
        raise ConfigurationError(f"endpoint URL {mask_url(url)!r} has port 0")
    return url


def check_event_types(types: Iterable[str] | None, known: Sequence[str]) -> tuple[str, ...]:
    """The event types an endpoint subscribes to, each checked against the
    naming rule and, when the app forwards a known set, against that set."""
    if types is None:
        return ()
    if isinstance(types, str):
        raise ConfigurationError(f"event_types takes a list of types, got the string {types!r}")
    out = []
    for t in types:
        if not isinstance(t, str) or not _TYPE_RULE.match(t):
            raise ConfigurationError(
                f"event type {t!r} breaks the rule: 'domain.action', e.g. 'order.created'"
            )
        if known and t not in known:
            raise ConfigurationError(
                f"event type {t!r} is not forwarded to webhooks; forwarded: {sorted(known)} "
                "(app.webhooks.forward(EventClass) in the app module adds one)"
            )
        out.append(t)
    return tuple(dict.fromkeys(out))


def check_limits(
    rate_limit: str | tuple[int, float] | None, concurrency: int | None, endpoint: str
) -> tuple[tuple[int, float] | None, int | None]:
    rate = None if rate_limit is None else parse_rate(rate_limit)
    if concurrency is not None and (
        not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
    ):
        raise ConfigurationError(
            f"endpoint {endpoint}: concurrency must be an integer >= 1, got {concurrency!r}"
        )
    return rate, concurrency


def new_endpoint(
    url: str,
    *,
    id: str | None,
    secret: str | None,
    event_types: Iterable[str] | None,
    known_types: Sequence[str],
    rate_limit: str | tuple[int, float] | None,
    concurrency: int | None,
    description: str,
    metadata: dict[str, Any] | None,
) -> Endpoint:
    """A new endpoint, every field checked (the error names the bad one)."""
    eid = id if id is not None else "ep_" + uuid7().replace("-", "")
    if not isinstance(eid, str) or not _ID_RULE.match(eid):
        raise ConfigurationError(
            f"endpoint id {eid!r}: use letters, digits, '_', '.', '-' (up to 100)"
        )
    rate, conc = check_limits(rate_limit, concurrency, eid)
    if metadata is not None:
        check_json(metadata, "endpoint metadata")
    return Endpoint(
        id=eid,
        url=check_url(url),
        secret=check_secret(secret) if secret is not None else new_secret(),
        event_types=check_event_types(event_types, known_types),
        rate_limit=rate,
        concurrency=conc,
        description=str(description),
        created_at=time.time(),
        metadata=dict(metadata or {}),
    )


class Registry:
    """Endpoints in the broker's kv store (see the module's docstring)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def add(self, ep: Endpoint) -> Endpoint:
        if not await self.broker.kv_add(key_of(ep.id), ep.encode()):
            raise ConfigurationError(f"an endpoint with id {ep.id!r} is already registered")
        return ep

    async def get(self, endpoint_id: str) -> Endpoint:
        raw = (await self.broker.kv_get([key_of(endpoint_id)])).get(key_of(endpoint_id))
        if raw is None:
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id!r} is registered")
        return Endpoint.decode(raw)

    async def all(self) -> list[Endpoint]:
        found = await self.broker.kv_scan(PREFIX)
        return sorted((Endpoint.decode(v) for v in found.values()), key=lambda e: e.created_at)

    async def update(self, endpoint_id: str, change: Callable[[Endpoint], Endpoint]) -> Endpoint:
        """Apply ``change`` to the stored endpoint atomically (see ``Broker.kv_update``)."""
        key = key_of(endpoint_id)

        def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], Endpoint | None]:
            raw = got.get(key)
            if raw is None:
                return {}, None
            new = change(Endpoint.decode(raw))
            return {key: new.encode()}, new

        out = await self.broker.kv_update([key], decide)
        if out is None:
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id!r} is registered")
        return out

    async def remove(self, endpoint_id: str) -> bool:
        return bool(await self.broker.kv_delete([key_of(endpoint_id)]))

    async def disable(self, endpoint_id: str, reason: str) -> Endpoint:
        now = time.time()
        return await self.update(
            endpoint_id,
            lambda e: (
                e
                if e.disabled
                else replace(e, disabled=True, disabled_reason=reason, disabled_at=now)
            ),
        )

    async def enable(self, endpoint_id: str) -> Endpoint:
        return await self.update(
            endpoint_id, lambda e: replace(e, disabled=False, disabled_reason="", disabled_at=None)
        )
