"""Coordination on Redis: locks with fencing tokens, the key-value store,
rate and concurrency limits (the seam's coordination part).

Each call is one script, so each is atomic on the server; every kv entry is
a field of one hash under the app's hash tag (``scripts/_kv.lua``), so the
calls are legal on a Redis Cluster too.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from ...errors import BrokerError
from ..base import Broker, KvWrite, kv_write
from .connection import Arg, Connection
from .lua import Scripts

T = TypeVar("T")

#: rounds of read, decide and compare-and-set a ``kv_update`` tries before it
#: gives up (each lost round backs off 1 ms, doubling to 50 ms, jittered: a
#: few seconds in all, far more than any real contention needs)
KV_UPDATE_ATTEMPTS = 200


class Coordination(Broker):
    """The seam's coordination methods on Redis (mixed into ``RedisBroker``)."""

    conn: Connection
    lua: Scripts

    # -- locks -------------------------------------------------------------------

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        now = await self.conn.now()
        r = await self.conn.run(self.lua.acquire, [name, owner, repr(now), repr(now + ttl)])
        return None if r is None else int(r)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        now = await self.conn.now()
        args: list[Arg] = [name, owner, token, repr(now), repr(now + ttl)]
        return bool(await self.conn.run(self.lua.renew, args))

    async def release(self, name: str, owner: str, token: int) -> None:
        await self.conn.run(self.lua.release, [name, owner, token])

    # -- key-value ---------------------------------------------------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        r = await self.conn.run(self.lua.kv_get, [repr(await self.conn.now()), *keys])
        return {k: v for k, v in zip(keys, r, strict=True) if v is not None}

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        if not items:
            return
        args: list[Arg] = ["" if ttl is None else repr((await self.conn.now()) + ttl)]
        for k, v in items.items():
            args += (k, bytes(v))
        await self.conn.run(self.lua.kv_set, args)

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """Optimistic and atomic: read the keys, ``decide``, then one script
        (``kv_cas.lua``) writes only if every key read still holds the value
        read (or is still absent); otherwise read and decide again.

        Why not WATCH/MULTI: every kv entry is a field of one hash (``kv``),
        and WATCH sees keys, not fields, so any kv write of the app (another
        job's record, a chord counter) would abort the transaction; the
        script compares exactly the keys read, and is as atomic (a script
        runs alone on the server, and every kv write is a script).  It also
        needs no connection of its own, and it is legal on a cluster: every
        kv key is a field under the app's hash tag.

        Read values travel back as SHA1 digests, so a big value costs its
        bytes once.  A write's ttl becomes its expiry time in ``kvx``, as
        ``kv_set`` stores it (on the server's clock, ``clock.py``, like every kv expiry
        here); a write without one clears any expiry the key had.
        """
        return await self._update(list(dict.fromkeys(keys)), decide, None)

    async def kv_update_known(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
        known: Mapping[str, bytes | None],
    ) -> T:
        """The first round decides on ``known`` instead of a read: the
        compare-and-set checks every key against it, as it checks a read,
        so a wrong belief only costs the read and the round a right one
        saves."""
        keys = list(dict.fromkeys(keys))
        if any(k not in known for k in keys):
            return await self._update(keys, decide, None)
        first = {k: v for k in keys if (v := known[k]) is not None}
        return await self._update(keys, decide, first)

    async def _update(
        self,
        keys: list[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
        first: dict[str, bytes] | None,
    ) -> T:
        delay = 0.001
        for _ in range(KV_UPDATE_ATTEMPTS):
            guessed = first is not None
            if first is not None:
                got, first = first, None
            else:
                got = await self.kv_get(keys)  # one script: a consistent read
            writes, out = decide(dict(got))
            if not writes:
                if guessed:  # nothing to compare it by: decide on a read
                    continue
                return out
            args: list[Arg] = [repr(await self.conn.now()), len(keys)]
            for k in keys:
                v = got.get(k)
                args += (k, "" if v is None else hashlib.sha1(v).hexdigest())
            at = await self.conn.now()
            for k, w in writes.items():
                data, ttl = kv_write(w)
                args += (k, data, "" if ttl is None else repr(at + ttl))
            if int(await self.conn.run(self.lua.kv_cas, args)):
                return out
            if guessed:  # the caller's belief was wrong: read at once
                continue
            # another writer changed a key between our read and our write
            await asyncio.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
            delay = min(delay * 2, 0.05)
        raise BrokerError(
            f"redis kv_update: the keys kept changing under {KV_UPDATE_ATTEMPTS} attempts"
            f" (first keys: {keys[:3]!r}); gave up"
        )

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        now = await self.conn.now()
        expires = "" if ttl is None else repr(now + ttl)
        return bool(await self.conn.run(self.lua.kv_add, [repr(now), key, bytes(value), expires]))

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        now = await self.conn.now()
        expires = "" if ttl is None else repr(now + ttl)
        return int(await self.conn.run(self.lua.kv_incr, [repr(now), key, amount, expires]))

    async def kv_delete(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        return int(await self.conn.run(self.lua.kv_delete, [repr(await self.conn.now()), *keys]))

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        r = await self.conn.run(self.lua.kv_scan, [repr(await self.conn.now()), prefix])
        return {r[i].decode(): r[i + 1] for i in range(0, len(r), 2)}

    # -- flow control ------------------------------------------------------------

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        await self.conn.read_clock()
        at = self.conn.clock.to_server(at)
        args: list[Arg] = [key, rate, repr(per), repr(at), repr(at - per), repr(at + per)]
        args += (repr(at - 2 * per), f"{at!r}:{secrets.token_hex(6)}")
        return float(await self.conn.run(self.lua.rate_limit, args))

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        now = await self.conn.now()
        args: list[Arg] = [b"acquire", key, limit, holder, repr(now), repr(now + ttl)]
        return bool(await self.conn.run(self.lua.slots, args))

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        if holds:
            args: list[Arg] = [b"extend", repr((await self.conn.now()) + ttl)]
            await self.conn.run(self.lua.slots, args + [x for h in holds for x in h])

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        if holds:
            await self.conn.run(self.lua.slots, [b"release", *(x for h in holds for x in h)])
