"""The SQLite broker's coordination: locks, the key-value store, limits.

Each call is one write transaction.  A lock's fencing token comes from a
counter in ``dw_meta``.  Short key-value and limit calls run on the
caller's thread when the write lock is free (``_quick``, connection.py).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import orjson

from ...flow import window_wait
from ..base import KvWrite, kv_write
from .connection import SQLiteConnection

T = TypeVar("T")

#: ``kv_add``: the entry, unless a live one holds the key
_KV_ADD = (
    "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
    " DO UPDATE SET value=excluded.value, expires=excluded.expires"
    " WHERE dw_kv.expires <= ?"
)


class SQLiteCoordination(SQLiteConnection):
    """Locks, the key-value store and flow control (rate limits, slots)."""

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        return await self._run(self._acquire, name, owner, ttl)

    def _acquire(self, name: str, owner: str, ttl: float) -> int | None:
        def run(c: sqlite3.Connection) -> int | None:
            now = time.time()
            row = c.execute(
                "SELECT owner, token, expires FROM dw_locks WHERE name=?", (name,)
            ).fetchone()
            if row is not None and row[2] > now:
                if row[0] != owner:
                    return None
                c.execute("UPDATE dw_locks SET expires=? WHERE name=?", (now + ttl, name))
                return int(row[1])
            token = int(
                c.execute("UPDATE dw_meta SET v=v+1 WHERE k='fence' RETURNING v").fetchone()[0]
            )
            c.execute(
                "INSERT INTO dw_locks (name, owner, token, expires) VALUES (?,?,?,?)"
                " ON CONFLICT (name) DO UPDATE SET owner=excluded.owner,"
                " token=excluded.token, expires=excluded.expires",
                (name, owner, token, now + ttl),
            )
            return token

        return self._wtx(run)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        return await self._run(self._renew, name, owner, token, ttl)

    def _renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        now = time.time()
        return bool(
            self._wtx(
                lambda c: (
                    c.execute(
                        "UPDATE dw_locks SET expires=? WHERE name=? AND owner=? AND token=?"
                        " AND expires>?",
                        (now + ttl, name, owner, token, now),
                    ).rowcount
                )
            )
        )

    async def release(self, name: str, owner: str, token: int) -> None:
        await self._run(
            lambda: self._wtx(
                lambda c: c.execute(
                    "DELETE FROM dw_locks WHERE name=? AND owner=? AND token=?",
                    (name, owner, token),
                )
            )
        )

    # -- key-value ---------------------------------------------------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        payload = orjson.dumps(list(keys))

        def run(c: sqlite3.Connection) -> dict[str, bytes]:
            rows = c.execute(
                "SELECT key, value FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
                " AND (expires IS NULL OR expires > ?)",
                (payload, time.time()),
            )
            return {k: bytes(v) for k, v in rows}

        return await self._quick(run, len(keys), write=False)

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        expires = None if ttl is None else time.time() + ttl
        rows = [(k, bytes(v), expires) for k, v in items.items()]
        await self._quick(
            lambda c: c.executemany(
                "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                " DO UPDATE SET value=excluded.value, expires=excluded.expires",
                rows,
            ),
            len(rows),
        )

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """One write transaction: the read, ``decide`` and the write, atomic
        against every other connection (on the caller's thread or one hop
        away, ``_quick``)."""
        payload = orjson.dumps(list(keys))

        def run(c: sqlite3.Connection) -> T:
            rows = c.execute(
                "SELECT key, value FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
                " AND (expires IS NULL OR expires > ?)",
                (payload, time.time()),
            )
            writes, out = decide({k: bytes(v) for k, v in rows})
            if writes:
                now = time.time()
                stored = []
                for k, v in writes.items():
                    data, ttl = kv_write(v)
                    stored.append((k, data, None if ttl is None else now + ttl))
                c.executemany(
                    "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                    " DO UPDATE SET value=excluded.value, expires=excluded.expires",
                    stored,
                ).close()
            return out

        return await self._quick(run, len(keys))

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        # one statement (an expired entry is taken over in place), so on the
        # caller's thread it needs no transaction around it (_quick_statement)
        now = time.time()
        rows = self._quick_statement(
            _KV_ADD, (key, bytes(value), None if ttl is None else now + ttl, now)
        )
        if rows is not None:
            return rows == 1

        def run(c: sqlite3.Connection) -> bool:
            now = time.time()
            cur = c.execute(_KV_ADD, (key, bytes(value), None if ttl is None else now + ttl, now))
            return cur.rowcount == 1

        return await self._quick(run)

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        def run(c: sqlite3.Connection) -> int:
            now = time.time()
            c.execute("DELETE FROM dw_kv WHERE key=? AND expires<=?", (key, now))
            row = c.execute(
                "INSERT INTO dw_kv (key, value, expires)"
                " VALUES (?, CAST(CAST(? AS TEXT) AS BLOB), ?) ON CONFLICT (key) DO UPDATE"
                " SET value=CAST(CAST(CAST(value AS INTEGER) + ? AS TEXT) AS BLOB)"
                " RETURNING value",
                (key, amount, None if ttl is None else now + ttl, amount),
            ).fetchone()
            return int(row[0])

        return await self._quick(run)

    async def kv_delete(self, keys: Sequence[str]) -> int:
        now = time.time()
        payload = orjson.dumps(list(keys))
        return await self._quick(
            lambda c: (
                c.execute(
                    "DELETE FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
                    " AND (expires IS NULL OR expires > ?)",
                    (payload, now),
                ).rowcount
            ),
            len(keys),
        )

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        def run(c: sqlite3.Connection) -> int:
            now = time.time()
            c.execute("DELETE FROM dw_kv WHERE key=? AND expires<=?", (key, now))
            row = c.execute("SELECT value FROM dw_kv WHERE key=?", (key,)).fetchone()
            members = set(orjson.loads(row[0])) if row is not None else set()
            if member not in members:
                members.add(member)
                c.execute(
                    "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                    " DO UPDATE SET value=excluded.value",
                    (key, orjson.dumps(sorted(members)), None if ttl is None else now + ttl),
                )
            return len(members)

        return await self._quick(run)

    async def kv_smembers(self, key: str) -> set[str]:
        raw = (await self.kv_get([key])).get(key)
        return set(orjson.loads(raw)) if raw is not None else set()

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        def run() -> dict[str, bytes]:
            # a range on the primary key (not substr(), which scans every row)
            rows = self._worker_conn().execute(
                "SELECT key, value FROM dw_kv WHERE key >= ? AND key < ?"
                " AND (expires IS NULL OR expires > ?)",
                (prefix, prefix + "\U0010ffff", time.time()),
            )
            return {k: bytes(v) for k, v in rows if k.startswith(prefix)}

        return await self._run(run)

    # -- flow control ----------------------------------------------------------

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        def run(c: sqlite3.Connection) -> float:
            c.execute("DELETE FROM dw_rate WHERE key=? AND t<=?", (key, at - 2 * per))
            times = [
                r[0]
                for r in c.execute(
                    "SELECT t FROM dw_rate WHERE key=? AND t>? AND t<? ORDER BY t",
                    (key, at - per, at + per),
                )
            ]
            wait = window_wait(times, at, rate, per)
            if wait == 0.0:
                c.execute("INSERT INTO dw_rate (key, t) VALUES (?, ?)", (key, at))
            return wait

        return await self._quick(run)

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            now = time.time()
            c.execute("DELETE FROM dw_slots WHERE key=? AND expires<=?", (key, now))
            held = c.execute(
                "SELECT count(*), sum(holder=?) FROM dw_slots WHERE key=?", (holder, key)
            ).fetchone()
            if not held[1] and held[0] >= limit:
                return False
            c.execute(
                "INSERT INTO dw_slots (key, holder, expires) VALUES (?,?,?)"
                " ON CONFLICT (key, holder) DO UPDATE SET expires=excluded.expires",
                (key, holder, now + ttl),
            )
            return True

        return await self._quick(run)

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        rows = [(time.time() + ttl, k, h) for k, h in holds]
        await self._quick(
            lambda c: c.executemany("UPDATE dw_slots SET expires=? WHERE key=? AND holder=?", rows),
            len(rows),
        )

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        rows = list(holds)
        await self._quick(
            lambda c: c.executemany("DELETE FROM dw_slots WHERE key=? AND holder=?", rows),
            len(rows),
        )
