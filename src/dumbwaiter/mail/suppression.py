"""The suppression list: addresses no mail is sent to.

It lives in the broker's key-value store, so every process of the app (web
servers taking webhooks, every worker) reads and writes the same list.  One
key per address (``mail:suppressed:<address>``), holding why and since when;
addresses are compared lower-cased and without their display name.
Entries do not expire unless a ``ttl`` is given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import keys
from ..message import dumps, loads
from .address import bare, check_address

if TYPE_CHECKING:
    from ..brokers.base import Broker

PREFIX = keys.MAIL_SUPPRESSED


@dataclass(frozen=True, slots=True)
class Suppression:
    address: str
    reason: str
    source: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "reason": self.reason,
            "source": self.source,
            "at": self.at,
        }


class Suppressions:
    """The list, over ``broker``'s key-value store."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def add(
        self, address: str, reason: str = "", *, source: str = "manual", ttl: float | None = None
    ) -> Suppression:
        addr = bare(check_address(address, "address"))
        entry = Suppression(addr, reason, source, time.time())
        await self.broker.kv_set({PREFIX + addr: dumps(entry.to_dict())}, ttl=ttl)
        return entry

    async def remove(self, address: str) -> bool:
        return bool(await self.broker.kv_delete([PREFIX + bare(address)]))

    async def get(self, address: str) -> Suppression | None:
        found = await self.which([address])
        return found.get(bare(address))

    async def which(self, addresses: Sequence[str]) -> dict[str, Suppression]:
        """The suppressed ones among ``addresses`` (bare address -> entry): one read."""
        keys = [PREFIX + bare(a) for a in addresses]
        if not keys:
            return {}
        found = await self.broker.kv_get(keys)
        return {k[len(PREFIX) :]: _entry(k[len(PREFIX) :], v) for k, v in found.items()}

    async def all(self) -> list[Suppression]:
        found = await self.broker.kv_scan(PREFIX)
        return sorted(
            (_entry(k[len(PREFIX) :], v) for k, v in found.items()), key=lambda s: s.address
        )


def _entry(address: str, raw: bytes) -> Suppression:
    try:
        d = loads(raw)
    except ValueError:
        d = {}
    if not isinstance(d, dict):
        d = {}
    return Suppression(
        address,
        str(d.get("reason", "")),
        str(d.get("source", "")),
        float(d.get("at", 0.0) or 0.0),
    )


def addresses(values: Iterable[str]) -> list[str]:
    return [bare(v) for v in values]
