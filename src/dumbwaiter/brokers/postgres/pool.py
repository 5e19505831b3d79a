"""The async connections of one event loop, and checks of idle connections.

psycopg's ``AsyncConnection`` belongs to the loop that opened it, and one
broker object is used from several loops (connection.py), while
``psycopg_pool.AsyncConnectionPool`` runs its own tasks on one loop and
cannot be closed once that loop has ended.  So each loop gets a ``LoopPool``
(a few lines: idle connections and a semaphore), and the pool of a loop that
has ended is closed without it (libpq's ``finish`` is synchronous).

A connection whose socket turns readable while it sits idle was closed by the
server (a restart, ``pg_terminate_backend``, an idle timeout): it is dropped
at checkout instead of failing the next statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
from psycopg import pq


class KeptConnection(psycopg.Connection[Any]):
    """A sync connection that keeps one cursor for the broker's own statements.

    ``Connection.execute`` makes a new cursor (and its adapters' map) for
    every statement; a one-at-a-time producer sends one statement per call,
    so that cursor was a visible part of the call's CPU.  The kept cursor is
    used by one caller at a time, as its connection is (the pool lends it to
    one thread); a statement on it replaces the last one's result."""

    _kept: psycopg.Cursor[Any] | None = None

    def kept(self) -> psycopg.Cursor[Any]:
        cur = self._kept
        if cur is None or cur.closed:
            cur = self._kept = self.cursor()
        return cur


class KeptAsyncConnection(psycopg.AsyncConnection[Any]):
    """``KeptConnection`` for the async pools (one task at a time holds it)."""

    _kept: psycopg.AsyncCursor[Any] | None = None

    def kept(self) -> psycopg.AsyncCursor[Any]:
        cur = self._kept
        if cur is None or cur.closed:
            cur = self._kept = self.cursor()
        return cur


def kept(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any] | psycopg.Cursor[Any]:
    """The connection's kept cursor when it has one (the broker's own
    connections), else the connection itself (a caller's)."""
    return conn.kept() if isinstance(conn, KeptConnection) else conn


def akept(
    conn: psycopg.AsyncConnection[Any],
) -> psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]:
    """``kept`` for async connections."""
    return conn.kept() if isinstance(conn, KeptAsyncConnection) else conn


def recording(report: Callable[[BaseException | None], None]) -> type[KeptConnection]:
    """A connection class (for ``ConnectionPool(connection_class=)``) that
    reports how each connect went to ``report`` (its error, or None): the
    pool connects in its own threads, and a caller that times out waiting
    for it would otherwise learn only "couldn't get a connection", not why."""

    class Recording(KeptConnection):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
            try:
                conn = super().connect(conninfo, **kwargs)
            except psycopg.Error as exc:
                report(exc)
                raise
            report(None)
            return conn

    return Recording


def looks_closed(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True if an idle connection cannot be used: closed, broken, or its socket
    is readable (the server said goodbye, or closed it, while we were idle)."""
    if conn.closed or conn.broken:
        return True
    # pgconn's status (an int), not conn.info's: ``info`` builds an object
    # per access, and every checkout of a one-at-a-time producer asks
    if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def check_sync(conn: psycopg.Connection[Any]) -> None:
    """``check`` callback of the sync pool: cheap, no round trip.  A dead
    connection is closed here, so the pool discards it and opens another
    (unclosed, the pool would take it back as it is and hand it out again)."""
    if looks_closed(conn):
        finish(conn)
        raise psycopg.OperationalError("connection closed by the server while idle")


class LoopPool:
    """Connections of one event loop, at most ``size`` of them at once."""

    def __init__(self, connect: Callable[[], Any], size: int) -> None:
        self._connect = connect
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._sem = asyncio.Semaphore(size)
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._sem:
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if looks_closed(candidate):
                    await _aclose(candidate)
                    continue
                conn = candidate
                break
            if conn is None:
                conn = await self._connect()
            try:
                yield conn
            finally:
                self._give_back(conn)

    def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        reusable = (
            not self._closed
            and not conn.closed
            and not conn.broken
            and conn.info.transaction_status == pq.TransactionStatus.IDLE
        )
        if reusable:
            self._idle.append(conn)
        else:  # mid-query (cancelled), broken, or pool closed: never reuse
            finish(conn)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _aclose(conn)

    def abandon(self) -> None:
        """Close without the loop (it has ended): libpq's finish is synchronous."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            finish(conn)


async def _aclose(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:  # closing a dead connection may complain; it is closed either way
        finish(conn)


def finish(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Close a connection without awaiting anything (safe from any loop or none)."""
    with contextlib.suppress(Exception):
        conn.pgconn.finish()
