"""A warning for sync producer calls made where an event loop is running.

``task.enqueue(...)`` in an ``async def`` endpoint works, but it holds the
server's event loop for the whole round trip to the broker (and for its
reconnect attempts while the broker is away): every other request on that
loop waits.  Nothing fails, so nobody notices until the latency graph does.
The sync calls therefore look for a running loop in their own thread and
warn, naming the ``await`` form to use instead.

A sync call from a thread without a running loop (a worker's thread pool, a
Django or Flask view, a sync FastAPI endpoint, which runs in a thread) is
what the sync API is for, and stays silent.

The warning is a ``RuntimeWarning``, so Python's default filter shows it
once per call site (module and line): a hot endpoint does not flood the log.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Protocol

__all__ = ["BlockingCallWarning", "warn_if_loop_running"]

#: ``asyncio._get_running_loop`` is exported by ``asyncio`` (its ``__all__``)
#: for exactly this check: it returns None instead of raising, so the common
#: case (no loop) costs one C call, not an exception.
_running_loop = asyncio._get_running_loop


class Named(Protocol):
    """A task as the warning names it."""

    name: str
    __name__: str


class BlockingCallWarning(RuntimeWarning):
    """A sync dumbwaiter call blocked a running event loop; use its ``a``-form."""


def warn_if_loop_running(task: Named | None, method: str, stacklevel: int) -> None:
    """Warn if this thread runs an event loop: ``task.method()`` (or
    ``app.method()`` without a task) should be ``await``-ed in its ``a`` form.

    ``stacklevel`` picks the frame the warning names, as for
    ``warnings.warn`` but counted from the caller of this function: 1 is that
    caller, 2 its caller, and so on.  The names are only built when a loop
    runs: the common (sync, no loop) path pays one C call."""
    if _running_loop() is None:
        return
    if task is None:
        call, instead = f"app.{method}()", f"app.a{method}(...)"
    else:
        call, instead = f"{task.name}.{method}()", f"{task.__name__}.a{method}(...)"
    warnings.warn(
        f"{call} blocks the running event loop until the broker answers; "
        f"in async code use `await {instead}`",
        BlockingCallWarning,
        stacklevel=stacklevel + 1,
    )
