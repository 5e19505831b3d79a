"""A state store behind a gate: no call reaches it before a check passed.

The RabbitMQ broker keeps its job state in another broker (``state=``) and
must not read or write it before the vhost agreed that this is the app's
store (``rabbitmq/announce.py``): a process that brings another store has
to refuse before it records, leases or counts anything in it.  The broker
reaches its store from dozens of places; wrapping the store once keeps the
rule in one spot, and a method added later cannot forget it.

The check runs on the first call and again after a failed one; once passed
the gate stays open until ``shut`` closes it (the broker then puts the
store itself in the gate's place, and the gate back on a refusal).  Every
method delegates to the store as is, so its atomicity (``kv_update``,
``kv_sadd``, limits) is the store's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from ..message import Message
from .base import Broker, KvWrite
from .types import Binding, Delivery, JobFilter, JobInfo, Page, QueueStats, Rescued

T = TypeVar("T")


class Gate(Broker):
    """``inner`` once ``check`` passed."""

    def __init__(self, inner: Broker, check: Callable[[], Awaitable[None]]) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self._check = check
        self.passed = False
        setattr(self, "capabilities", inner.capabilities)  # noqa: B010 (a per-instance ClassVar)

    def __repr__(self) -> str:
        return repr(self.inner)

    def shut(self) -> None:
        """Close the gate: the next call checks again."""
        self.passed = False

    async def _pass(self) -> None:
        if not self.passed:
            await self._check()
            self.passed = True

    async def open(self) -> None:
        await self._pass()
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    # -- what a state store is used for: kv, locks, limits ----------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        await self._pass()
        return await self.inner.kv_get(keys)

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        await self._pass()
        await self.inner.kv_set(items, ttl)

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        await self._pass()
        return await self.inner.kv_add(key, value, ttl)

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        await self._pass()
        return await self.inner.kv_incr(key, amount, ttl)

    async def kv_delete(self, keys: Sequence[str]) -> int:
        await self._pass()
        return await self.inner.kv_delete(keys)

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        await self._pass()
        return await self.inner.kv_scan(prefix)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        await self._pass()
        return await self.inner.kv_update(keys, decide)

    async def kv_update_known(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
        known: Mapping[str, bytes | None],
    ) -> T:
        await self._pass()
        return await self.inner.kv_update_known(keys, decide, known)

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        await self._pass()
        return await self.inner.kv_sadd(key, member, ttl)

    async def kv_smembers(self, key: str) -> set[str]:
        await self._pass()
        return await self.inner.kv_smembers(key)

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        await self._pass()
        return await self.inner.acquire(name, owner, ttl)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        await self._pass()
        return await self.inner.renew(name, owner, token, ttl)

    async def release(self, name: str, owner: str, token: int) -> None:
        await self._pass()
        await self.inner.release(name, owner, token)

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        await self._pass()
        return await self.inner.rate_limit(key, rate, per, at)

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        await self._pass()
        return await self.inner.slot_acquire(key, limit, holder, ttl)

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        await self._pass()
        await self.inner.slot_extend(holds, ttl)

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        await self._pass()
        await self.inner.slot_release(holds)

    # -- the rest of the seam, gated alike (a state store is not asked for it) --

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        await self._pass()
        await self.inner.declare(queues, bindings)

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        await self._pass()
        return await self.inner.enqueue(msgs)

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        await self._pass()
        return await self.inner.fetch(queues, limit, lease, wait, worker)

    async def ack(self, ds: Sequence[Delivery]) -> None:
        await self._pass()
        await self.inner.ack(ds)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        await self._pass()
        await self.inner.retry(ds)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        await self._pass()
        await self.inner.dead(ds)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        await self._pass()
        await self.inner.requeue(ds)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        await self._pass()
        return await self.inner.extend(ds, lease)

    async def rescue(self) -> Rescued:
        await self._pass()
        return await self.inner.rescue()

    async def stats(self) -> list[QueueStats]:
        await self._pass()
        return await self.inner.stats()

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        await self._pass()
        return await self.inner.list_jobs(filter, cursor, limit)

    async def get(self, id: str) -> JobInfo | None:
        await self._pass()
        return await self.inner.get(id)

    async def replay(self, filter: JobFilter) -> int:
        await self._pass()
        return await self.inner.replay(filter)

    async def purge(self, filter: JobFilter) -> int:
        await self._pass()
        return await self.inner.purge(filter)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        await self._pass()
        return await self.inner.cancel(ids)

    async def pause(self, queue: str) -> None:
        await self._pass()
        await self.inner.pause(queue)

    async def resume(self, queue: str) -> None:
        await self._pass()
        await self.inner.resume(queue)
