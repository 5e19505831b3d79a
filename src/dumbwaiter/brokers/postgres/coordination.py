"""The PostgreSQL broker's coordination: locks, the key-value store, limits.

Locks are rows of ``dw_locks`` whose fencing tokens come from the sequence
``dw_fence``; ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` takes a free or
expired lock (or renews our own) in one atomic statement.  Rate limits and
concurrency slots are one call each of a function (migration 0003).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors

from ...errors import BrokerError
from ..base import KvWrite, kv_write
from .connection import PostgresConnection

T = TypeVar("T")

#: times a ``kv_update`` runs again after a plain writer (``kv_set``,
#: ``kv_add``...) created one of its absent keys meanwhile, or a deadlock with
#: one, before it gives up: such a meeting is rare, and a few retries settle it
KV_UPDATE_ATTEMPTS = 50


class _Conflict(Exception):
    """A plain writer created a key a ``kv_update`` read as absent."""


def _lock_id(text: str) -> int:
    """A signed 32-bit hash: one half of a two-key advisory lock."""
    return int.from_bytes(
        hashlib.blake2b(text.encode(), digest_size=4).digest(), "big", signed=True
    )


class PostgresCoordination(PostgresConnection):
    """Locks, the key-value store and flow control (rate limits, slots)."""

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        params = {"name": name, "owner": owner, "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> int | None:
            row = await (await c.execute(self.q.acquire, params)).fetchone()
            return None if row is None else int(row[0])

        return await self._run(run)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        params = {"name": name, "owner": owner, "token": token, "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> bool:
            return (await c.execute(self.q.renew, params)).rowcount == 1

        return await self._run(run)

    async def release(self, name: str, owner: str, token: int) -> None:
        params = {"name": name, "owner": owner, "token": token}
        await self._run(lambda c: c.execute(self.q.release, params))

    # -- key-value ---------------------------------------------------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        async def run(c: psycopg.AsyncConnection[Any]) -> dict[str, bytes]:
            cur = await c.execute(self.q.kv_get, (list(keys),))
            return {k: bytes(v) for k, v in await cur.fetchall()}

        return await self._run(run)

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        if not items:
            return
        # rows locked in key order, as kv_update locks them: the two never deadlock
        keys = sorted(items)
        params = {"keys": keys, "values": [bytes(items[k]) for k in keys], "ttl": ttl}
        await self._run(lambda c: c.execute(self.q.kv_set, params))

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """One transaction: an advisory lock per key, the rows read ``FOR
        UPDATE``, ``decide``, the writes, commit.

        The advisory locks (``pg_advisory_xact_lock(schema, hash(key))``,
        taken in sorted order, so two updates never wait for each other in a
        cycle) serialize updates that share a key, absent keys included; the
        row locks hold off plain writers (``kv_set``, ``kv_incr``,
        ``kv_delete``) of the keys that exist.  A plain writer that creates a
        key read as absent meanwhile makes the transaction roll back and run
        again (as does a deadlock with one).  Not retried after a lost
        connection: the commit may have happened (as ``kv_incr``).  A write's
        ttl is counted from the server's ``now()``, as ``kv_set``'s."""
        keys = list(dict.fromkeys(keys))
        ns = _lock_id(f"dumbwaiter.kv:{self.schema}")
        locks = sorted({_lock_id(k) for k in keys})
        wanted = set(keys)

        async def run(c: psycopg.AsyncConnection[Any]) -> T:
            async with c.transaction():
                if locks:
                    await c.execute(self.q.kv_lock, (ns, locks))
                cur = await c.execute(self.q.kv_read_locked, (keys,))
                rows = await cur.fetchall()
                writes, out = decide({k: bytes(v) for k, v, live in rows if live})
                if writes:
                    ordered = sorted(writes)  # rows locked in one order, as kv_set does
                    present = {k for k, _, _ in rows}
                    split = [kv_write(writes[k]) for k in ordered]
                    params = {
                        "keys": ordered,
                        "values": [data for data, _ in split],
                        "ttls": [ttl for _, ttl in split],
                        "fresh": [k for k in ordered if k in wanted and k not in present],
                    }
                    cur = await c.execute(self.q.kv_write_locked, params)
                    if cur.rowcount != len(ordered):
                        raise _Conflict
            return out

        delay = 0.001
        for _ in range(KV_UPDATE_ATTEMPTS):
            try:
                return await self._run(run, retry=False)
            except (_Conflict, pg_errors.DeadlockDetected):
                await asyncio.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
                delay = min(delay * 2, 0.05)
        raise BrokerError(
            f"postgres kv_update: the keys kept changing under {KV_UPDATE_ATTEMPTS} attempts"
            f" (first keys: {keys[:3]!r}); gave up"
        )

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        params = {"key": key, "value": bytes(value), "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> bool:
            return (await (await c.execute(self.q.kv_add, params)).fetchone()) is not None

        return await self._run(run)

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        params = {"key": key, "amount": amount, "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            row = await (await c.execute(self.q.kv_incr, params)).fetchone()
            assert row is not None
            return int(row[0])

        # not idempotent: a retry after a lost reply could count twice
        return await self._run(run, retry=False)

    async def kv_delete(self, keys: Sequence[str]) -> int:
        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            row = await (await c.execute(self.q.kv_delete, (list(keys),))).fetchone()
            return int(row[0]) if row else 0

        return await self._run(run)

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        async def run(c: psycopg.AsyncConnection[Any]) -> dict[str, bytes]:
            cur = await c.execute(self.q.kv_scan, (prefix,))
            return {k: bytes(v) for k, v in await cur.fetchall()}

        return await self._run(run)

    # -- flow control ------------------------------------------------------------
    #
    # rate_limit and slot_acquire are one call each of a function (migration
    # 0003) that locks the key's row, then reads and writes under that lock.
    # Neither is idempotent, so neither is retried after a lost connection:
    # the worker treats the error like any other and the job runs again later.

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        await self._read_clock()
        params = (key, rate, per, self.clock.to_server(at))

        async def run(c: psycopg.AsyncConnection[Any]) -> float:
            row = await (await c.execute(self.q.rate_take, params)).fetchone()
            assert row is not None
            return float(row[0])

        return await self._run(run, retry=False)

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        params = (key, limit, holder, ttl)

        async def run(c: psycopg.AsyncConnection[Any]) -> bool:
            row = await (await c.execute(self.q.slot_acquire, params)).fetchone()
            return bool(row and row[0])

        # idempotent for one holder: a second take of a held slot only extends it
        return await self._run(run)

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        if holds:
            params = {"keys": [k for k, _ in holds], "holders": [h for _, h in holds], "ttl": ttl}
            await self._run(lambda c: c.execute(self.q.slot_extend, params))

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        if holds:
            params = {"keys": [k for k, _ in holds], "holders": [h for _, h in holds]}
            await self._run(lambda c: c.execute(self.q.slot_release, params))
