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

**Handoffs** (migration 0005).  The connection also listens on a channel of
its own (``hand_channel``).  An idle fetch's claim registers its wait in
``dw_waiters`` under a fresh token (``pending`` maps it to the fetch's
``Waiter``); a producer that hands a job to that wait sends it here.  The
job goes to its fetch if that fetch still waits, else to the ``inbox``,
which the next fetch of its queue takes first; an inbox job not taken within
``INBOX_HOLD`` seconds is given back uncharged (a busy worker must not sit on
a job while its lease runs out), as is the inbox when the broker closes.  A
handoff whose NOTIFY was lost (the connection dropped) is adopted by the
next claim that settles its token (see queries.waiting), so the token leaves
``pending`` when either comes first, and the other is then ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import psycopg
from psycopg import sql

from .. import deadline
from ..types import Delivery
from .rows import handed

log = logging.getLogger("dumbwaiter.postgres")

#: seconds a handed job waits in the inbox for a fetch before it is given back
INBOX_HOLD = 1.0


class Waiter:
    """An idle fetch of this loop: woken by NOTIFY, handed jobs directly."""

    __slots__ = ("active", "event", "handed", "queues")

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = frozenset(queues)
        self.event = asyncio.Event()
        #: jobs handed to this fetch while it waits or claims
        self.handed: list[Delivery] = []
        #: False once its fetch has returned: later handoffs go to the inbox
        self.active = True

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)


class Listener:
    def __init__(
        self,
        channel: str,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        give_back: Callable[[list[Delivery]], None] | None = None,
    ) -> None:
        self.channel = channel
        #: this listener's own channel: handoffs to this loop's fetches
        self.hand_channel = f"dw_hand_{secrets.token_hex(8)}"
        self._connect = connect
        #: requeues jobs nobody took (set by the broker)
        self.give_back = give_back
        self._waiters: set[Waiter] = set()
        #: token of each wait registered by this loop whose handoff is not
        #: settled yet -> the fetch that registered it
        self.pending: dict[int, Waiter] = {}
        #: tokens of waits whose registering claim is on its way: not settled
        #: by another claim meanwhile (it might not see the registration yet)
        self.registering: set[int] = set()
        #: jobs handed after their fetch stopped waiting
        self.inbox: list[Delivery] = []
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: True while LISTEN is in force (notifications will arrive)
        self.listening = False
        self._up = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            # it outlives the call that started it: no producer's deadline
            self._task = deadline.detached(asyncio.get_running_loop(), self._run())
            self._task.set_name("dumbwaiter-postgres-listen")

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
        """The fetch of ``w`` returns: what was handed to it and not taken
        goes to the inbox, and so will later handoffs to its waits."""
        self._waiters.discard(w)
        w.active = False
        if w.handed:
            rest, w.handed = w.handed, []
            self.keep(rest)

    def wake(self, queue: str | None) -> None:
        for w in self._waiters:
            if queue is None or queue in w.queues:
                w.event.set()

    def carried(self, w: Waiter) -> list[int]:
        """The unsettled waits a claim of ``w``'s fetch settles: its own, and
        those of ended fetches whose queues it serves (whatever it adopts is
        of its queues)."""
        return [
            t
            for t, o in self.pending.items()
            if (o is w or (not o.active and o.queues <= w.queues)) and t not in self.registering
        ]

    def carries(self, w: Waiter) -> bool:
        """Whether a wait of ``w``'s fetch is still unsettled (registered,
        and neither handed nothing nor handed a job that reached us)."""
        return any(o is w for o in self.pending.values())

    def take(self, queues: Sequence[str], limit: int) -> list[Delivery]:
        """Up to ``limit`` inbox jobs of ``queues`` (the next fetch's first)."""
        if not self.inbox:
            return []
        want = set(queues)
        out = [d for d in self.inbox if d.queue in want][:limit]
        if out:
            taken = {id(d) for d in out}
            self.inbox = [d for d in self.inbox if id(d) not in taken]
        return out

    def keep(self, ds: list[Delivery]) -> None:
        """Jobs handed to this loop with no fetch to take them now: the next
        fetch of their queue takes them, or they are given back after
        ``INBOX_HOLD`` seconds."""
        self.inbox.extend(ds)
        loop = asyncio.get_running_loop()
        for d in ds:
            loop.call_later(INBOX_HOLD, self._expire, d)
            self.wake(d.queue)

    def _expire(self, d: Delivery) -> None:
        if self._closed:  # the broker gave the inbox back as it closed
            return
        if any(x is d for x in self.inbox):
            self.inbox = [x for x in self.inbox if x is not d]
            if self.give_back is not None:
                self.give_back([d])

    def drain(self) -> list[Delivery]:
        """Everything in the inbox (the broker closes: to be given back)."""
        out, self.inbox = self.inbox, []
        return out

    def _hand(self, payload: str) -> None:
        try:
            token, d = handed(payload)
        except (ValueError, IndexError, TypeError, orjson.JSONDecodeError):
            log.warning("ignored a malformed handoff notification: %.100r", payload)
            return
        w = self.pending.pop(token, None)
        if w is None:  # settled already (adopted by a claim): not twice
            return
        if d is None:  # its producer stored nothing: claim instead
            w.event.set()
        elif w.active:
            w.handed.append(d)
            w.event.set()
        else:
            self.keep([d])
            w.event.set()  # a withdrawal may wait for it (transport._withdraw)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                self._conn = conn = await self._connect()
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.hand_channel)))
                self.listening = True
                self._up.set()
                backoff = 0.05
                self.wake(None)  # anything sent while we were not listening
                hand = self.hand_channel
                async for n in conn.notifies():
                    if n.channel == hand:
                        self._hand(n.payload)
                    elif n.channel == self.channel:
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
        self._closed = True
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
