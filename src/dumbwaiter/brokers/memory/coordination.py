"""Coordination in memory: locks with fencing tokens, the key-value store,
rate and concurrency limits (the seam's coordination part), each under the
store's lock, so atomic against other threads' calls too."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import orjson

from ...flow import window_wait
from ..base import Broker, KvWrite, kv_write
from .store import Lock, Store

T = TypeVar("T")


class Coordination(Broker):
    """The seam's coordination methods in memory (mixed into ``MemoryBroker``)."""

    store: Store

    # -- locks -------------------------------------------------------------------

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        now = time.time()
        with self.store.lock:
            held = self.store.locks.get(name)
            if held is not None and held.expires > now and held.owner != owner:
                return None
            if held is None or held.owner != owner or held.expires <= now:
                self.store.fence += 1
                held = Lock(owner=owner, token=self.store.fence, expires=now + ttl)
                self.store.locks[name] = held
            else:
                held.expires = now + ttl
            return held.token

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        now = time.time()
        with self.store.lock:
            held = self.store.locks.get(name)
            if held is None or held.owner != owner or held.token != token or held.expires <= now:
                return False
            held.expires = now + ttl
            return True

    async def release(self, name: str, owner: str, token: int) -> None:
        with self.store.lock:
            held = self.store.locks.get(name)
            if held is not None and held.owner == owner and held.token == token:
                del self.store.locks[name]

    # -- key-value ---------------------------------------------------------------

    def _kv_live(self, key: str, now: float) -> bytes | None:
        entry = self.store.kv.get(key)
        if entry is None:
            return None
        if entry[1] is not None and entry[1] <= now:
            del self.store.kv[key]
            return None
        return entry[0]

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        now = time.time()
        with self.store.lock:
            found = {k: self.store.kv_live(k, now) for k in keys}
        return {k: v for k, v in found.items() if v is not None}

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        expires = None if ttl is None else time.time() + ttl
        with self.store.lock:
            for k, v in items.items():
                self.store.kv[k] = (bytes(v), expires)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """Under the store's lock: atomic against other threads' calls too."""
        now = time.time()
        with self.store.lock:
            found = {k: self.store.kv_live(k, now) for k in keys}
            writes, out = decide({k: v for k, v in found.items() if v is not None})
            for k, v in writes.items():
                data, ttl = kv_write(v)
                self.store.kv[k] = (data, None if ttl is None else now + ttl)
        return out

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        now = time.time()
        with self.store.lock:
            if self.store.kv_live(key, now) is not None:
                return False
            self.store.kv[key] = (bytes(value), None if ttl is None else now + ttl)
            return True

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        now = time.time()
        with self.store.lock:
            current = self.store.kv_live(key, now)
            expires = (
                self.store.kv[key][1]
                if current is not None
                else (None if ttl is None else now + ttl)
            )
            value = (int(current) if current is not None else 0) + amount
            self.store.kv[key] = (str(value).encode(), expires)
            return value

    async def kv_delete(self, keys: Sequence[str]) -> int:
        now = time.time()
        with self.store.lock:
            n = 0
            for k in keys:
                if self.store.kv_live(k, now) is not None:
                    del self.store.kv[k]
                    n += 1
            return n

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        now = time.time()
        with self.store.lock:
            raw = self.store.kv_live(key, now)
            members = set(orjson.loads(raw)) if raw is not None else set()
            members.add(member)
            expires = (
                self.store.kv[key][1] if raw is not None else (None if ttl is None else now + ttl)
            )
            self.store.kv[key] = (orjson.dumps(sorted(members)), expires)
            return len(members)

    async def kv_smembers(self, key: str) -> set[str]:
        with self.store.lock:
            raw = self.store.kv_live(key, time.time())
        return set(orjson.loads(raw)) if raw is not None else set()

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        now = time.time()
        with self.store.lock:
            keys = [k for k in self.store.kv if k.startswith(prefix)]
            found = {k: self.store.kv_live(k, now) for k in keys}
        return {k: v for k, v in found.items() if v is not None}

    # -- flow control ----------------------------------------------------------

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        with self.store.lock:
            log = self.store.rates.setdefault(key, [])
            while log and log[0] <= at - 2 * per:  # far behind any window still open
                log.pop(0)
            wait = window_wait(log, at, rate, per)
            if wait == 0.0:
                bisect.insort(log, at)
            return wait

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        now = time.time()
        with self.store.lock:
            held = self.store.slots.setdefault(key, {})
            for h in [h for h, exp in held.items() if exp <= now]:
                del held[h]
            if holder not in held and len(held) >= limit:
                return False
            held[holder] = now + ttl
            return True

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        now = time.time()
        with self.store.lock:
            for key, holder in holds:
                held = self.store.slots.get(key, {})
                if holder in held:
                    held[holder] = now + ttl

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        with self.store.lock:
            for key, holder in holds:
                self.store.slots.get(key, {}).pop(holder, None)
