"""The producer's deadline: how long a call that hands work over may wait
for a broker that cannot be reached.

A web request that enqueues a job must get an answer in a few seconds, job
stored or ``BrokerUnavailable``; a worker, a relay or a scheduler would
rather keep trying for as long as the broker's ``reconnect`` window (or for
ever).  So the producer API (``Task.enqueue`` and friends, ``App.publish``,
workflows) opens a deadline around its call (``App(enqueue_timeout=...)``,
or per call), and each broker's retry loops and connects read it here:
``retry_until`` is the deadline if a producer call is running, else the
broker's own window.

The deadline is a context variable, so it follows the call wherever the
broker takes it (into the tasks it awaits, through the App's portal for sync
callers) without a parameter on every seam method.  Tasks a broker starts
to outlive the call (a connection's reader, a shared connect) must not
inherit it: ``detached`` runs a coroutine outside any producer's deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: (start, deadline) of the running producer call, monotonic (None: no
#: producer call, or one without a deadline)
_call: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "dumbwaiter_producer_deadline", default=None
)

Token = contextvars.Token[tuple[float, float] | None]


def start(seconds: float | None) -> Token | None:
    """Open a producer call's deadline ``seconds`` from now (None: none);
    a call inside another keeps the outer one's if that is earlier.  Pass
    the result to ``end``."""
    if seconds is None:
        return None
    now = time.monotonic()
    outer = _call.get()
    if outer is not None and outer[1] < now + seconds:
        return _call.set(outer)
    return _call.set((now, now + seconds))


def end(token: Token | None) -> None:
    if token is not None:
        _call.reset(token)


def current() -> float | None:
    """The running producer call's deadline (monotonic), or None."""
    call = _call.get()
    return None if call is None else call[1]


def retry_until(window: float) -> float:
    """The monotonic time a call's retries stop: the running producer
    call's deadline, or ``window`` seconds from now (the broker's
    ``reconnect``) for everything else."""
    call = _call.get()
    return time.monotonic() + window if call is None else call[1]


#: seconds a try may take even at its producer's deadline: the last try (made
#: at the deadline, see ``Backoff``) gets a moment to fail with its own reason
#: (refused, a wrong password), not a timeout that says nothing
LAST_TRY = 0.25


def remaining(at_most: float) -> float:
    """Seconds one wait (a connect, a confirm) may take: ``at_most``, and no
    longer than what is left to the producer call's deadline (``LAST_TRY``
    at least)."""
    call = _call.get()
    if call is None:
        return at_most
    return min(at_most, max(LAST_TRY, call[1] - time.monotonic()))


def detached(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``loop.create_task(coro)`` outside any producer's deadline: for tasks
    that outlive the call that started them (a connection shared by every
    caller of a loop), whose own retries follow the broker's window."""
    ctx = contextvars.copy_context()
    ctx.run(_call.set, None)
    return loop.create_task(coro, context=ctx)


class Backoff:
    """The pauses of a call that tries again while the server is away: 50 ms
    doubling to 1 s, until ``retry_until(window)`` (the producer's deadline,
    or the broker's window); the last pause ends at the deadline, so the
    last try is made there."""

    __slots__ = ("delay", "started", "until")

    def __init__(self, window: float) -> None:
        call = _call.get()
        # a producer call has waited since it started (its connect, say)
        self.started = time.monotonic() if call is None else call[0]
        self.until = retry_until(window)
        self.delay = 0.05

    def pause(self) -> float | None:
        """Seconds to wait before the next try, or None: time is up."""
        left = self.until - time.monotonic()
        if left <= 0:
            return None
        pause = min(self.delay, left)
        self.delay = min(self.delay * 2, 1.0)
        return pause

    @property
    def waited(self) -> float:
        """Seconds since the first try (since the producer call started)."""
        return time.monotonic() - self.started
