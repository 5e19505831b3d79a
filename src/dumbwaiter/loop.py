"""The event loop the long-running commands (worker, scheduler, relay) run on.

A worker spends most of its time in the event loop itself: waking timers,
reading sockets, switching between a few dozen jobs.  uvloop (libuv) does that
work in C and keeps timers to within a fraction of a millisecond, where the
default loop's epoll timeouts round up to whole milliseconds (measured in
docs/benchmarks.md, "Figures behind the core's choices").  So the commands
use uvloop when it is installed (it is a dependency of the package where it
builds: CPython on Linux and macOS), and ``--loop asyncio`` (or
``DUMBWAITER_LOOP=asyncio``) keeps the standard loop for whoever needs it (a
debugger, a library that insists).

Code that embeds a ``Worker`` in its own program chooses its own loop; nothing
here changes the process-wide event loop policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import MissingDependency

T = TypeVar("T")

#: environment variable read by ``--loop``
LOOP_ENV = "DUMBWAITER_LOOP"
#: the values ``--loop`` accepts; ``auto`` is uvloop when importable
LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A function making the loop ``choice`` names, or None for asyncio's own."""
    if choice not in LOOPS:
        raise ValueError(f"unknown event loop {choice!r}: expected one of {', '.join(LOOPS)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise MissingDependency(
                "the uvloop event loop was asked for but uvloop is not installed: "
                "pip install uvloop (or use --loop asyncio)"
            ) from None
        return None

    def new_loop() -> asyncio.AbstractEventLoop:
        loop = uvloop.new_event_loop()
        # asyncio.run sets the loop it makes as the thread's current one;
        # a Runner with a factory does not, and get_event_loop() must agree
        asyncio.set_event_loop(loop)
        return loop

    return new_loop


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` names."""
    factory = loop_factory(choice)
    if factory is None:
        return asyncio.run(main)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    finally:
        asyncio.set_event_loop(None)


def loop_name() -> str:
    """The running loop's kind, for logs: ``uvloop`` or ``asyncio``."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
