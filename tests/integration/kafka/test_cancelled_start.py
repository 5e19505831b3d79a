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
import warnings
from pathlib import Path

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
