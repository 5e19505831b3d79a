"""``LISTEN`` for idle fetches: one connection per event loop wakes them on ``NOTIFY``.

Whatever makes jobs ready (an enqueue, a retry due now, a requeue, a rescue,
a replay) sends ``NOTIFY`` with the queue's name in the same transaction, so
the notification is delivered exactly when the jobs become visible.  An idle
fetch registers a ``Waiter`` for its queues, claims once more (a
notification may have come before the waiter existed), then sleeps until a
notification for one of its queues, the next scheduled job, or its deadline.

The connection reconnects with backoff; while it is down, ``listening`` is
False and fetches poll instead.  After a reconnect every waiter is woken,
since notifications sent meanwhile were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger("dumbwaiter.postgres")


class Waiter:
    __slots__ = ("event", "queues")

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = frozenset(queues)
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)


class Listener:
    def __init__(
        self, channel: str, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]
    ) -> None:
        self.channel = channel
        self._connect = connect
        self._waiters: set[Waiter] = set()
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: True while LISTEN is in force (notifications will arrive)
        self.listening = False
        self._up = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="dumbwaiter-postgres-listen"
            )

    async def ready(self, timeout: float) -> None:
        """Wait (briefly) for LISTEN to be in force, so a first wait is not a poll."""
        self.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._up.wait(), timeout)

    def add(self, queues: Sequence[str]) -> Waiter:
        w = Waiter(queues)
        self._waiters.add(w)
        return w

    def remove(self, w: Waiter) -> None:
        self._waiters.discard(w)

    def wake(self, queue: str | None) -> None:
        for w in self._waiters:
            if queue is None or queue in w.queues:
                w.event.set()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                self._conn = conn = await self._connect()
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                self.listening = True
                self._up.set()
                backoff = 0.05
                self.wake(None)  # anything sent while we were not listening
                async for n in conn.notifies():
                    self.wake(n.payload or None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.listening:
                    log.warning("LISTEN connection lost (%s); reconnecting", exc)
                else:
                    log.debug("LISTEN connection failed (%s); retrying in %.2f s", exc, backoff)
            finally:
                self.listening = False
                self._up.clear()
                dropped, self._conn = self._conn, None
                if dropped is not None:
                    with contextlib.suppress(Exception):
                        dropped.pgconn.finish()
            self.wake(None)  # waiters fall back to polling
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def abandon(self) -> None:
        """The loop has ended (its tasks were cancelled): close the socket."""
        self._task = None
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
