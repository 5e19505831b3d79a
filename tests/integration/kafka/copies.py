"""Reading a topic's records as a worker reads them (``transport.Copy``),
for tests that look at what a producer wrote."""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer

from dumbwaiter.brokers.kafka import KafkaBroker
from dumbwaiter.brokers.kafka.transport import Copy, copy_of


async def first_copies(b: KafkaBroker, topic: str, n: int) -> list[Copy]:
    """The first ``n`` records of ``topic`` (fewer if 20 s pass first)."""
    c = AIOKafkaConsumer(topic, **b.config, auto_offset_reset="earliest")
    await c.start()
    try:
        got: list[Copy] = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            for recs in (await c.getmany(timeout_ms=500)).values():
                got += [copy_of(r) for r in recs]
        return got
    finally:
        await c.stop()
