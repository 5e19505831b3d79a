"""A call cancelled while one of our aiokafka clients starts leaves no
connection open.

A worker's stop interrupts its idle fetch, and a fetch may be starting a
client just then (the admin client, a consumer group's consumer); the CLI's
``stats`` starts several clients in a row.  aiokafka's bootstrap holds its
first connection where the client's close cannot reach it while it waits
for the cluster's metadata, so a cancellation there left the socket to be
collected unclosed (a ``ResourceWarning``: the known leak of the tests that
ran ``stats`` under load).  The proxy (``stall.py``) holds that wait open
for one client start after another, and the call is cancelled there.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import warnings
from pathlib import Path
from typing import Any

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from tests.integration.kafka.server import bootstrap, new_prefix, url
from tests.integration.kafka.stall import Stall
from tests.integration.redis.server import redis_url


async def _calls(broker: Broker) -> None:
    """What ``dumbwaiter stats`` asks, then a worker's fetch and an event
    listing: each starts clients of its own."""
    await broker.open()
    await broker.stats()
    await broker.partition_lag()
    await broker.fetch(["default"], 1, 30.0, 0.0)
    await broker.list_events("some.event", None, None, None, 10)


async def _cancelled_at(stall: Stall, app_url: str, nth: int) -> tuple[bool, list[str]]:
    """Run ``_calls`` on a fresh broker, cancel it while the ``nth`` client
    start waits for the metadata; (it got that far, the unclosed warnings
    about connections through the proxy)."""
    port = stall.address.rpartition(":")[2]
    broker = from_url(app_url)
    stall.hold(nth)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        call = asyncio.ensure_future(_calls(broker))
        asked = asyncio.ensure_future(stall.asked.wait())
        await asyncio.wait([call, asked], return_when=asyncio.FIRST_COMPLETED)
        asked.cancel()
        reached = stall.asked.is_set()
        call.cancel()
        stall.release()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await broker.close()
        del call
        gc.collect()
    unclosed = [
        str(w.message)
        for w in seen
        if issubclass(w.category, ResourceWarning) and port in str(w.message)
    ]
    return reached, unclosed


async def test_a_call_cancelled_while_a_client_starts_leaves_no_connection_open(
    tmp_path: Path,
) -> None:
    async with Stall(bootstrap()) as stall:
        app_url = url(new_prefix(), redis_url(tmp_path), servers=stall.address, session_timeout="2")
        first = from_url(app_url)
        try:
            await first.declare(["default"])
        finally:
            await first.close()
        nth = 1
        while True:
            reached, unclosed = await _cancelled_at(stall, app_url, nth)
            assert unclosed == [], f"client start {nth}: {unclosed}"
            if not reached:
                break
            nth += 1
        # the admission's clients, the producer, the consumers of the lag,
        # the fetch and the listing: each start was cancelled once
        assert nth > 5


async def test_a_close_cancelled_while_a_write_is_in_flight_leaves_no_connection_open(
    tmp_path: Path,
) -> None:
    """A close cut short by a cancellation (a worker cancelled while its
    broker closes; ``asyncio.wait_for`` around a close) must not leave the
    connections of a producer whose write is in flight open."""
    app_url = url(new_prefix(), redis_url(tmp_path), session_timeout="2")
    first = from_url(app_url)
    try:
        await first.declare(["default"])
        topic = first.names.queue_topic("default")  # type: ignore[attr-defined]
    finally:
        await first.close()
    port = int(bootstrap().rpartition(":")[2])
    for turns in range(1, CLOSE_TURNS):  # (0: cancelled before it began: nothing ran)
        before = _open_to(port)
        broker: Any = from_url(app_url)
        producer = await broker.link().producer(1024 * 1024)
        sent = await producer.send(topic, b"in flight")  # its sender connects to the leader
        closing = asyncio.ensure_future(broker.close())
        for _ in range(turns):  # the cancellation lands somewhere in the close
            await asyncio.sleep(0)
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await sent
        await asyncio.sleep(0)  # a closed transport lets its socket go on the next turn
        assert _open_to(port) <= before, f"cancelled after {turns} turns of the loop"


def _open_to(port: int) -> int:
    """This process' established TCP connections to 127.0.0.1:``port``."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[8:-1])
    count = 0
    with open("/proc/self/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            remote, state, inode = cols[2], cols[3], cols[9]
            if state == "01" and int(remote.split(":")[1], 16) == port and inode in mine:
                count += 1
    return count


#: how many points of a close the cancellation is tried at (one turn of the
#: loop apart)
CLOSE_TURNS = 40
