"""One client per event loop, for every engine.

A broker object can serve several event loops at once: the app's portal
thread runs one for synchronous callers, the worker another, a test a third.
The client libraries' connections (redis-py, psycopg, nats, aiormq) belong
to the loop that made them, so each engine keeps one client per loop.  The
rules for that registry are the same everywhere and easy to get subtly
wrong, so they live here once:

* the running loop's client is made on first use, and the last one used is
  remembered so the common case costs one identity check;
* clients of loops that have since closed (``asyncio.run`` ended) are
  abandoned, never awaited: their loop cannot run a coroutine any more;
* ``close`` closes the running loop's client by awaiting it, asks each other
  running loop to close its own and waits for those (the caller may stop
  that loop next), and abandons the rest;
* after ``fork`` the child starts with no clients: a socket shared with the
  parent is the parent's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("dumbwaiter.broker")

#: seconds ``close`` waits for another thread's loop to close its client
CLOSE_ELSEWHERE = 10.0


class PerLoop(Generic[T]):
    """The clients of one broker, one per event loop.

    ``make(loop)`` builds a client (it must not await: ``get`` is sync);
    ``aclose(client)`` closes one on its own loop; ``abandon(client)`` lets
    go of one whose loop cannot run it (no I/O)."""

    def __init__(
        self,
        make: Callable[[asyncio.AbstractEventLoop], T],
        aclose: Callable[[T], Awaitable[None]],
        abandon: Callable[[T], None],
    ) -> None:
        self._make = make
        self._aclose = aclose
        self._abandon = abandon
        self._by_loop: dict[asyncio.AbstractEventLoop, T] = {}
        self._last: tuple[asyncio.AbstractEventLoop, T] | None = None
        self._pid = os.getpid()
        #: the slow path only: loops of several threads may make or drop
        #: clients at once (the portal's, the worker's)
        self._lock = threading.Lock()

    def get(self) -> T:
        """The running loop's client, made on first use."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop:
            return last[1]
        with self._lock:
            if self._pid != os.getpid():
                self._forget_parent()
            client = self._by_loop.get(loop)
            if client is None:
                for old in [lp for lp in self._by_loop if lp.is_closed()]:
                    self._abandon(self._by_loop.pop(old))
                client = self._by_loop[loop] = self._make(loop)
            self._last = (loop, client)
            return client

    def current(self) -> T | None:
        """The running loop's client if it has one (nothing is made)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self._by_loop.get(loop)

    def items(self) -> list[tuple[asyncio.AbstractEventLoop, T]]:
        """Every loop's client, for admin paths that look at all of them."""
        return list(self._by_loop.items())

    def __len__(self) -> int:
        return len(self._by_loop)

    async def close(self) -> None:
        """Close every loop's client (see the module's rules)."""
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        with self._lock:
            clients, self._by_loop, self._last = self._by_loop, {}, None
        elsewhere: list[asyncio.Future[None]] = []
        for loop, client in clients.items():
            if loop is current:
                await self._aclose(client)
            elif loop.is_closed() or not loop.is_running():
                self._abandon(client)
            else:
                cf = asyncio.run_coroutine_threadsafe(self._close_one(client), loop)
                elsewhere.append(asyncio.wrap_future(cf))
        if elsewhere:
            _, late = await asyncio.wait(elsewhere, timeout=CLOSE_ELSEWHERE)
            if late:
                # their loops go on closing them; a failure then is logged
                log.warning(
                    "%d client(s) of other event loops were not closed after %.0f s;"
                    " not waiting for them",
                    len(late),
                    CLOSE_ELSEWHERE,
                )

    async def _close_one(self, client: T) -> None:
        """Close ``client`` on its own loop; a failure is logged there, not
        left in a future no one reads (nothing else can be done with it)."""
        try:
            await self._aclose(client)
        except Exception:
            log.exception("closing a client on its event loop failed")

    def _forget_parent(self) -> None:
        """In a forked child: the parent's clients are not ours to close."""
        for client in self._by_loop.values():
            self._abandon(client)
        self._by_loop, self._last = {}, None
        self._pid = os.getpid()
