"""What the test process cleans up when it ends: this run's vhost, schemas,
key prefixes and streams on the shared servers, and the tansu it started.

``register`` is ``atexit.register``, with one difference: the session's end
(``pytest_sessionfinish``, tests/conftest.py) runs them first.  Under
pytest-xdist a worker's exit is not the place: the controller gives a
finished worker 10 s to exit and then kills it, and ``rabbitmqctl`` alone
can take longer on a loaded machine, so a killed worker left its tansu
running and its vhost, schemas and streams behind.  The session's end comes
before the worker reports that it finished, and nothing cuts it short.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

_funcs: list[tuple[Callable[..., object], tuple[Any, ...]]] = []


def register(func: Callable[..., object], *args: Any) -> None:
    """Run ``func(*args)`` at the session's end, or at exit if it never comes."""
    _funcs.append((func, args))
    atexit.register(func, *args)


def run() -> None:
    """Run every cleanup registered, the last first (as ``atexit`` would)."""
    while _funcs:
        func, args = _funcs.pop()
        atexit.unregister(func)
        func(*args)
