"""Waiting on another process, which no event here can tell us about.

A worker process, a relay, a server: their progress shows only in what they
write (a log file, a table, a server's answers), so a test polls for it,
with a deadline and a message saying what never happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(cond: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """Poll ``cond`` every 20 ms until it is true; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
