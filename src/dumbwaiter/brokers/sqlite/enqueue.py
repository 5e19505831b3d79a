"""The SQLite broker's producer side: enqueue, publish, the outbox's fast path.

A batch is one ``BEGIN IMMEDIATE`` transaction of multi-row inserts that
skip a stored id or a held key; what went in is counted per queue and state
from ``RETURNING`` (one counter update per batch, no trigger per row).  A
publish logs each new event and inserts one job per bound queue in one
transaction.  On the caller's own connection to this very file (the
outbox's fast path) the same inserts run inside the caller's transaction.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from ...errors import ConfigurationError
from ...message import Message, encode_checked, uuid7
from ...sqldb import Sql
from .. import capacity, deadline
from ..sql.rows import events_page
from ..types import Binding, delivery_of
from .connection import SQLiteConnection
from .schema import apply_schema

#: rows per INSERT statement (12 parameters each, under SQLite's 32,766 limit)
_INSERT_CHUNK = 2000
#: header "unique" -> the states in which a key's holder no longer blocks a new job
_UNIQUE_RELEASE = {
    "active": "('succeeded', 'dead', 'cancelled')",
    "queued": "('running', 'succeeded', 'dead', 'cancelled')",
}


class SQLiteEnqueue(SQLiteConnection):
    """Enqueue, events and the outbox's fast path."""

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        # the deadline is read here: the broker's thread has no producer call
        wait = deadline.remaining(self.busy_timeout)
        return await self._run(self._enqueue_as_producer, msgs, wait)

    def _enqueue_as_producer(self, msgs: Iterable[Message], wait: float) -> list[str]:
        rows = self._rows(msgs)  # encoded before the write lock is taken
        return self._as_producer(lambda c: self._insert(c, rows), wait)

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        rows = self._rows(msgs)
        wait = deadline.remaining(self.busy_timeout)
        return self._producer_tx(self._sync_conn(), lambda c: self._insert(c, rows), wait)

    async def enqueue_bounded(
        self, msgs: Sequence[Message], max_ready: Mapping[str, int]
    ) -> list[str]:
        """The count of a bounded queue's waiting jobs (``dw_counts``, kept in
        step by every write) and the insert in one ``BEGIN IMMEDIATE``
        transaction: the write lock makes the pair atomic for every process
        that opens the file, so no lock of our own is needed."""
        adding = capacity.per_queue(msgs, max_ready)
        wait = deadline.remaining(self.busy_timeout)
        return await self._run(self._enqueue_bounded, msgs, adding, dict(max_ready), wait)

    def _enqueue_bounded(
        self,
        msgs: Sequence[Message],
        adding: Mapping[str, int],
        max_ready: Mapping[str, int],
        wait: float,
    ) -> list[str]:
        rows = self._rows(msgs)

        def tx(c: sqlite3.Connection) -> list[str]:
            counts = c.execute(
                "SELECT queue, sum(n) FROM dw_counts WHERE state IN"
                " ('ready', 'scheduled', 'retrying')"
                " AND queue IN (SELECT value FROM json_each(?)) GROUP BY queue",
                (orjson.dumps(sorted(adding)),),
            ).fetchall()
            capacity.admit(adding, dict(counts), max_ready)
            return self._insert(c, rows)

        return self._as_producer(tx, wait)

    def _rows(self, msgs: Iterable[Message]) -> list[tuple[Any, ...]]:
        """Encode (and size-check) before taking the write lock; keep only rows."""
        now = time.time()
        rows = []
        limit = self.max_message_size
        for m in msgs:
            scheduled = m.eta is not None and m.eta > now
            rows.append(
                (
                    m.id,
                    m.queue,
                    m.name,
                    m.kind,
                    "scheduled" if scheduled else "ready",
                    m.priority,
                    m.eta if scheduled else now,
                    now,
                    m.max_attempts,
                    m.key if m.kind == "task" else None,
                    encode_checked(m, limit),
                    m.key,
                    *((m.headers["unique"],) if "unique" in m.headers else ()),
                )
            )
        return rows

    def _insert_rows(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        """Insert (ignoring duplicates) in multi-row statements, and count what
        went in per queue and state from RETURNING: one counter update per
        batch, not a trigger per row."""
        added: Counter[tuple[str, str]] = Counter()
        for start in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[start : start + _INSERT_CHUNK]
            params = [v for r in chunk for v in r[:12]]
            values = ",".join(["(?,?,?,?,?,?,?,?,?,?,?,?)"] * len(chunk))
            added.update(
                conn.execute(
                    "INSERT OR IGNORE INTO dw_jobs (id, queue, name, kind, state, priority,"
                    f" run_at, updated_at, max_attempts, key, body, msg_key) VALUES {values}"
                    " RETURNING queue, state",
                    params,
                ).fetchall()
            )
        if added:
            conn.executemany(
                "INSERT INTO dw_counts (queue, state, n) VALUES (?,?,?)"
                " ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n",
                [(q, st, n) for (q, st), n in added.items()],
            )
        return sum(added.values())

    def _insert(
        self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]], remember: bool = True
    ) -> list[str]:
        for r in rows:
            mode = _UNIQUE_RELEASE.get(r[12]) if len(r) > 12 and r[9] is not None else None
            if mode:  # the key's holder no longer blocks: free the key for this job
                conn.execute(
                    f"UPDATE dw_jobs SET key=NULL WHERE key=? AND state IN {mode}", (r[9],)
                )
        inserted = self._insert_rows(conn, rows)
        new_queues = {r[1] for r in rows} - (self._known_queues if remember else set())
        if new_queues:
            conn.executemany(
                "INSERT OR IGNORE INTO dw_queues (name) VALUES (?)", [(q,) for q in new_queues]
            )
            if remember:  # not when the caller's transaction may still roll back
                self._known_queues |= new_queues
        ids = [r[0] for r in rows]
        keyed = any(r[9] is not None for r in rows)
        if keyed and inserted < len(rows):
            # some were duplicates: report the id of the job that holds each key
            keys = [r[9] for r in rows if r[9] is not None]
            found = dict(
                conn.execute(
                    "SELECT key, id FROM dw_jobs WHERE key IN (SELECT value FROM json_each(?))",
                    (orjson.dumps(keys),),
                ).fetchall()
            )
            ids = [found.get(r[9], r[0]) if r[9] is not None else r[0] for r in rows]
        return ids

    # -- events ------------------------------------------------------------------

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        qs, bs = list(queues), list(bindings)
        await self._run(self._wtx, lambda c: self._declare(c, qs, bs))

    def _declare(self, c: sqlite3.Connection, queues: list[str], bindings: list[Binding]) -> None:
        c.executemany(
            "INSERT OR IGNORE INTO dw_queues (name) VALUES (?)",
            [(q,) for q in {*queues, *(b.queue for b in bindings)}],
        )
        c.executemany(
            "INSERT INTO dw_bindings (pattern, queue, max_attempts) VALUES (?,?,?)"
            " ON CONFLICT (pattern, queue) DO UPDATE SET max_attempts=excluded.max_attempts",
            [(b.pattern, b.queue, b.max_attempts) for b in bindings],
        )

    async def publish(self, msgs: Iterable[Message]) -> int:
        wait = deadline.remaining(self.busy_timeout)
        return await self._run(self._publish_as_producer, msgs, wait)

    def _publish_as_producer(self, msgs: Iterable[Message], wait: float) -> int:
        events = self._event_rows(msgs)
        return self._as_producer(lambda c: self._fan_out(c, events), wait)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        events = self._event_rows(msgs)
        wait = deadline.remaining(self.busy_timeout)
        return self._producer_tx(self._sync_conn(), lambda c: self._fan_out(c, events), wait)

    def _event_rows(self, msgs: Iterable[Message]) -> list[tuple[Message, bytes]]:
        limit = self.max_message_size
        return [(m, encode_checked(m, limit)) for m in msgs]

    def _fan_out(
        self, c: sqlite3.Connection, events: list[tuple[Message, bytes]], remember: bool = True
    ) -> int:
        """Log each new event, then one job per bound queue, in one transaction."""
        now = time.time()
        bindings: dict[str, list[Binding]] = {}
        for pattern, queue, attempts in c.execute(
            "SELECT pattern, queue, max_attempts FROM dw_bindings"
        ):
            bindings.setdefault(pattern, []).append(Binding(pattern, queue, attempts))
        deliveries: list[Message] = []
        for m, body in events:
            cur = c.execute(
                "INSERT OR IGNORE INTO dw_events (id, type, published_at, body) VALUES (?,?,?,?)",
                (m.id, m.name, now, body),
            )
            if cur.rowcount == 1:  # a duplicate publish is not delivered again
                deliveries += [delivery_of(m, b, uuid7()) for b in bindings.get(m.name, ())]
        if deliveries:
            self._insert(c, self._rows(deliveries), remember)
        return len(deliveries)

    # -- the outbox's fast path: the caller's transaction on this very file ------

    async def owns_connection(self, sql: Sql) -> bool:
        return self.owns_connection_sync(sql) if not sql.is_async else False

    def owns_connection_sync(self, sql: Sql) -> bool:
        return sql.dialect == "sqlite" and sql.sqlite_path() == os.path.realpath(self.path)

    async def enqueue_with(self, sql: Sql, msgs: Sequence[Message]) -> None:
        raise NotImplementedError("async SQLite connections go through the outbox table")

    def enqueue_with_sync(self, sql: Sql, msgs: Sequence[Message]) -> None:
        conn = _driver_connection(sql)
        if conn.isolation_level is None and not conn.in_transaction:
            raise ConfigurationError(
                "app.outbox(conn) on an autocommit sqlite3 connection needs a transaction: "
                "BEGIN first, so the job commits (or rolls back) with your changes"
            )
        if not self._ready:  # their transaction may hold the lock: create what is missing in it
            apply_schema(conn, self.path)
        tasks = [m for m in msgs if m.kind == "task"]
        events = [m for m in msgs if m.kind != "task"]
        if tasks:
            self._insert(conn, self._rows(tasks), remember=False)
        if events:
            self._fan_out(conn, self._event_rows(events), remember=False)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        def run() -> tuple[list[Message], str | None]:
            rows = (
                self._worker_conn()
                .execute(
                    "SELECT id, body FROM dw_events WHERE type=? AND id>?"
                    " AND published_at>=? AND published_at<=? ORDER BY id LIMIT ?",
                    (
                        event_type,
                        cursor or "",
                        since if since is not None else float("-inf"),
                        until if until is not None else float("inf"),
                        limit + 1,
                    ),
                )
                .fetchall()
            )
            return events_page(rows, limit)

        return await self._run(run)


def _driver_connection(sql: Sql) -> sqlite3.Connection:
    """The sqlite3 connection under the caller's (maybe SQLAlchemy) connection."""
    raw = sql.raw
    if isinstance(raw, sqlite3.Connection):
        return raw
    conn = raw.connection() if hasattr(raw, "get_bind") else raw  # a Session
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    return driver
