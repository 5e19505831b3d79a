"""The outbox relay: committed ``dw_outbox`` rows to the broker, in order.

Runs as ``dumbwaiter relay --source URL`` or inside a worker
(``dumbwaiter worker --with-relay``), in any number of replicas: one holds
the relay lease for the source database (coordination part of the seam) and
relays; the others stand by and take over when it stops renewing.  Rows go in
``seq`` order, in batches: tasks with ``enqueue``, events with ``publish``.
A row is marked relayed after the broker confirmed it; a relay that dies in
between sends the batch again, with the same message ids, which the broker
(and the consumers' inbox) drop.  Relayed rows are pruned after
``retention``.  An idle relay wakes on LISTEN/NOTIFY (PostgreSQL) or on the
SQLite file's writes, polling only as a fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from . import keys
from .errors import ConfigurationError, MessageDecodeError
from .message import Message, decode
from .outbox import NOTIFY_CHANNEL, ensure_outbox_sync
from .redact import mask_url
from .sqldb import Sql, adapt

if TYPE_CHECKING:
    from .ports import Runtime
    from .worker import Worker

log = logging.getLogger("dumbwaiter.relay")

_PENDING = "SELECT seq, body FROM dw_outbox WHERE relayed_at IS NULL ORDER BY seq LIMIT :n"
_MARK = (
    "UPDATE dw_outbox SET relayed_at = :now WHERE seq >= :lo AND seq <= :hi AND relayed_at IS NULL"
)
_PRUNE = "DELETE FROM dw_outbox WHERE relayed_at IS NOT NULL AND relayed_at < :before"


class Relay:
    """Moves one source database's outbox to ``app``'s broker."""

    def __init__(
        self,
        app: Runtime,
        source: str,
        *,
        batch: int = 1000,
        retention: float = 3600.0,
        lease: float = 10.0,
        poll: float = 1.0,
    ) -> None:
        self.app = app
        self.source = source
        self.batch = batch
        self.retention = retention
        self.lease = lease
        self.poll = poll
        self.owner = f"{socket.gethostname()}:{secrets.token_hex(3)}"
        self.relayed = 0
        parts = urlsplit(source)
        self._kind = "sqlite" if parts.scheme == "sqlite" else "postgresql"
        if parts.scheme not in ("sqlite", "postgresql", "postgres"):
            raise ConfigurationError(
                f"outbox source {source!r}: use sqlite:///PATH or postgresql://..."
            )
        self._lock = keys.RELAY_LOCK + _identity(source)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dumbwaiter-relay")
        self._conn: Any = None
        self._token: int | None = None

    # -- the source database, on the relay's own thread ---------------------------

    def _sql(self) -> Sql:
        if self._conn is None:
            if self._kind == "sqlite":
                path = urlsplit(self.source).path[1:]
                self._conn = sqlite3.connect(
                    path, timeout=30, isolation_level=None, check_same_thread=False
                )
                self._conn.execute("PRAGMA journal_mode=WAL")
            else:
                import psycopg

                self._conn = psycopg.connect(_dsn(self.source), autocommit=True)
        return adapt(self._conn)

    def _read(self) -> list[tuple[int, bytes]]:
        sql = self._sql()
        ensure_outbox_sync(sql)
        return [(int(s), bytes(b)) for s, b in sql.fetch_sync(_PENDING, {"n": self.batch})]

    def _mark(self, lo: int, hi: int) -> None:
        self._sql().execute_sync(_MARK, {"now": time.time(), "lo": lo, "hi": hi})

    def _prune(self) -> int:
        return self._sql().execute_sync(_PRUNE, {"before": time.time() - self.retention})

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # -- relaying ------------------------------------------------------------------

    async def relay_once(self) -> int:
        """Move one batch of committed rows; return how many."""
        rows = await self._db(self._read)
        if not rows:
            return 0
        msgs: list[Message] = []
        for seq, body in rows:
            try:
                msgs.append(decode(body))
            except MessageDecodeError as exc:
                log.error("outbox row %d is not a message (%s); skipped", seq, exc)
        await self._send(msgs)
        await self._db(self._mark, rows[0][0], rows[-1][0])
        self.relayed += len(rows)
        return len(rows)

    async def _send(self, msgs: list[Message]) -> None:
        """Runs of tasks and of events, in order (order per key is kept)."""
        run: list[Message] = []
        for m in msgs:
            if run and run[-1].kind != m.kind:
                await self._send_run(run)
                run = []
            run.append(m)
        if run:
            await self._send_run(run)

    async def _send_run(self, run: list[Message]) -> None:
        if run[0].kind == "task":
            await self.app.broker.enqueue(run)
        else:
            await self.app.broker.publish(run)

    async def run(self) -> None:
        """Relay until cancelled (standing by while another replica leads)."""
        waiter = _Waiter(self)
        last_prune = 0.0
        try:
            while True:
                if not await self._lead():
                    await asyncio.sleep(self.lease / 3)
                    continue
                try:
                    n = await self.relay_once()
                except Exception:
                    log.exception("relaying failed; trying again")
                    await asyncio.sleep(self.poll)
                    continue
                if time.monotonic() - last_prune > 60:
                    last_prune = time.monotonic()
                    await self._db(self._prune)
                if n < self.batch:
                    await waiter.wait(self.poll)
        finally:
            waiter.close()
            if self._token is not None:
                with contextlib.suppress(Exception):
                    await self.app.broker.release(self._lock, self.owner, self._token)
            await self._db(self._close)
            self._pool.shutdown(wait=False)

    async def _lead(self) -> bool:
        b = self.app.broker
        if self._token is not None and await b.renew(
            self._lock, self.owner, self._token, self.lease
        ):
            return True
        self._token = await b.acquire(self._lock, self.owner, self.lease)
        if self._token is not None:
            log.info("relay %s leads the outbox of %s", self.owner, mask_url(self.source))
        return self._token is not None

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Waiter:
    """Wakes the idle relay on the source's writes: NOTIFY on PostgreSQL, the
    WAL file on SQLite; ``poll`` seconds at most either way."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self._waker: Any = None
        self._listener: Any = None

    async def wait(self, timeout: float) -> None:
        r = self.relay
        if r._kind == "sqlite":
            if self._waker is None:
                from .brokers.sqlite.wake import FileWaker

                self._waker = FileWaker(urlsplit(r.source).path[1:] + "-wal")
                self._waker.arm()
                return  # check once more after arming
            await self._waker.wait(timeout)
            self._waker.arm()
            return
        if self._listener is None:
            import psycopg

            self._listener = await psycopg.AsyncConnection.connect(_dsn(r.source), autocommit=True)
            await self._listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            return
        gen = self._listener.notifies(timeout=timeout)
        async for _ in gen:
            break

    def close(self) -> None:
        if self._waker is not None:
            self._waker.close()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().create_task(self._listener.close())


def _dsn(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def _identity(url: str) -> str:
    """The source database, without credentials (the relay lease's name)."""
    p = urlsplit(url)
    host = p.hostname or ""
    return f"{p.scheme}://{host}:{p.port or ''}{p.path}"


def service(source: str) -> Callable[[Worker], Any]:
    """A worker side service (``Worker(app, services=[relay.service(url)])``)."""

    async def relay(worker: Worker) -> None:
        await Relay(worker.app, source).run()

    relay.__name__ = "relay"
    return relay
