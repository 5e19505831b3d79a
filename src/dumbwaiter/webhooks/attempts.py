"""The attempt log: what was sent to an endpoint, and what it answered.

One kv entry per HTTP attempt, ``webhooks:log:ENDPOINT:WEBHOOK_ID:TIME``:
status, latency, the first kilobyte of the response (or the error), the job
and the attempt number.  A delivery's log is one ``kv_scan`` of its prefix.
Entries live as long as the delivery's job: the task keeps its result for
the webhooks' ``retention``, and its entries get the same TTL; a delivery
that ends dead keeps its entries without expiry, as the dead job itself is
kept until replayed or purged.

Per endpoint, counters of successes and failures per minute
(``webhooks:stat:ENDPOINT:MINUTE:ok|fail``, kept two days) give the failure
rate a dashboard shows without reading every entry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from .. import keys

if TYPE_CHECKING:
    from ..brokers.base import Broker

LOG = keys.WEBHOOK_LOG
STAT = keys.WEBHOOK_STAT
#: the most of a response body an attempt keeps
EXCERPT = 1024
#: per-minute counters are kept this long (seconds)
STAT_TTL = 2 * 86400.0


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP attempt of one delivery."""

    at: float
    endpoint: str
    webhook_id: str
    job_id: str
    attempt: int
    #: delivered, failed, throttled (429/503 with Retry-After), gone (410),
    #: refused (SSRF guard), deferred (breaker open: nothing sent)
    outcome: str
    status: int | None = None
    latency_ms: float | None = None
    response: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "endpoint": self.endpoint,
            "webhook_id": self.webhook_id,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "outcome": self.outcome,
            "status": self.status,
            "latency_ms": self.latency_ms,
            "response": self.response,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attempt:
        return cls(
            at=float(d["at"]),
            endpoint=str(d["endpoint"]),
            webhook_id=str(d["webhook_id"]),
            job_id=str(d.get("job_id", "")),
            attempt=int(d.get("attempt", 0)),
            outcome=str(d.get("outcome", "")),
            status=d.get("status"),
            latency_ms=d.get("latency_ms"),
            response=str(d.get("response", "")),
            error=str(d.get("error", "")),
        )


def excerpt(body: bytes) -> str:
    """At most ``EXCERPT`` bytes of a response, as text (a cut character is replaced)."""
    return body[:EXCERPT].decode("utf-8", errors="replace")


def _prefix(endpoint: str, webhook_id: str) -> str:
    return f"{LOG}{endpoint}:{webhook_id}:"


def _minute(t: float) -> int:
    return int(t // 60)


class AttemptLog:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def add(self, a: Attempt, ttl: float | None) -> None:
        key = f"{_prefix(a.endpoint, a.webhook_id)}{int(a.at * 1e6):017d}"
        await self.broker.kv_set({key: orjson.dumps(a.to_dict())}, ttl=ttl)
        if a.outcome != "deferred":
            ok = "ok" if a.outcome == "delivered" else "fail"
            await self.broker.kv_incr(f"{STAT}{a.endpoint}:{_minute(a.at)}:{ok}", 1, STAT_TTL)

    async def of(self, endpoint: str, webhook_id: str) -> list[Attempt]:
        """Every attempt of one delivery, oldest first."""
        found = await self.broker.kv_scan(_prefix(endpoint, webhook_id))
        return [Attempt.from_dict(orjson.loads(found[k])) for k in sorted(found)]

    async def keep(self, endpoint: str, webhook_id: str, ttl: float | None) -> None:
        """Give every entry of a delivery a new TTL (None: keep while its job is dead)."""
        found = await self.broker.kv_scan(_prefix(endpoint, webhook_id))
        if found:
            await self.broker.kv_set(found, ttl=ttl)

    async def counts(self, endpoint: str, minutes: int = 60) -> tuple[int, int]:
        """(successes, failures) of ``endpoint`` over the last ``minutes``."""
        now = _minute(time.time())
        keys = [
            f"{STAT}{endpoint}:{m}:{k}"
            for m in range(now - minutes + 1, now + 1)
            for k in ("ok", "fail")
        ]
        got = await self.broker.kv_get(keys)
        ok = sum(int(v) for k, v in got.items() if k.endswith(":ok"))
        fail = sum(int(v) for k, v in got.items() if k.endswith(":fail"))
        return ok, fail

    async def forget(self, endpoints: Sequence[str]) -> None:
        """Drop every entry and counter of removed endpoints."""
        for e in endpoints:
            keys = list(await self.broker.kv_scan(f"{LOG}{e}:"))
            keys += list(await self.broker.kv_scan(f"{STAT}{e}:"))
            if keys:
                await self.broker.kv_delete(keys)
