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
    """One idle fetch's wake-up: set by a notification for one of its queues.

    A bare future and a timer, not ``asyncio.wait_for(Event.wait())``: on
    Python 3.11 that wraps the wait in a task of its own, so a notification
    reached the fetch three turns of the loop later instead of one (the
    enqueue-to-start latency of an idle worker)."""

    __slots__ = ("_fut", "queues", "woken")

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = frozenset(queues)
        #: a notification came since the last ``clear``
        self.woken = False
        self._fut: asyncio.Future[None] | None = None

    def clear(self) -> None:
        self.woken = False

    def set(self) -> None:
        self.woken = True
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until ``set`` or ``timeout`` seconds, whichever comes first."""
        if self.woken:
            return
        loop = asyncio.get_running_loop()
        fut = self._fut = loop.create_future()
        timer = loop.call_later(timeout, _release, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._fut = None


def _release(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


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
                w.set()

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
