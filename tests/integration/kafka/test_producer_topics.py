"""The producer keeps every topic of the app in view when it writes to a
topic it did not know.

aiokafka's producer starts out asking the cluster for every topic, and the
first send to a topic it does not know makes that topic the only one it
asks for: the next answer forgets the others, and a copy handed over for
one of them in that moment waits for its partition's leader until the
request times out (a batch's callback, enqueued from a worker the moment
its dead shards first wrote to the dead-letter topic, waited 40 s: the
Kafka batch test's drain timed out on it).  ``produce.in_view`` asks for
every topic again instead.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import dumbwaiter as dw
from tests.brokers import BROKERS


def test_a_write_to_a_new_topic_leaves_the_others_in_the_producers_view(
    tmp_path: Path,
) -> None:
    url = BROKERS["kafka"](tmp_path)

    async def go() -> None:
        first = dw.App(url)
        try:
            await first.broker.declare(["known"])  # made before the producer below starts
        finally:
            await first.broker.close()
        app = dw.App(url)

        @app.task(queue="known")
        def old(n: int) -> None: ...

        @app.task(queue="new")
        def new(n: int) -> None: ...

        broker: Any = app.broker
        try:
            await old.aenqueue(1)  # a topic the producer knew from its start
            await new.aenqueue(2)  # a topic made after: the producer asks the cluster
            producer = await broker.link().producer(broker._request_size())
            cluster = producer.client.cluster
            for queue in ("known", "new"):
                topic = broker.names.queue_topic(queue)
                assert cluster.partitions_for_topic(topic), f"the producer forgot {topic}"
            await old.aenqueue(3)
        finally:
            await app.broker.close()

    asyncio.run(go())
