"""Small helpers for conformance tests: waiting on conditions, not on sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dumbwaiter.brokers.base import Broker, Delivery
from dumbwaiter.message import ErrorRecord

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], timeout: float = 10.0
) -> T:
    """Call ``probe`` until ``accept`` holds for its value (or fail after ``timeout``).

    Used only where time itself must pass (a lease or an eta running out)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout} s; last value {value!r}")
        await asyncio.sleep(0.02)


async def fetch_all(broker: Broker, queue: str = "default", lease: float = 30.0) -> list[Delivery]:
    out: list[Delivery] = []
    while True:
        ds = await broker.fetch([queue], 100, lease, 0)
        if not ds:
            return out
        out += ds


def error(
    kind: str = "builtins.ValueError", message: str = "boom", attempt: int = 1
) -> ErrorRecord:
    return ErrorRecord(
        time=time.time(),
        type=kind,
        message=message,
        traceback="Traceback (most recent call last):\n  ...\nValueError: boom\n",
        worker="test-worker",
        attempt=attempt,
    )
