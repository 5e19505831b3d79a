"""A consumer group whose position is past the end of a partition's log:
what a cluster that lost acknowledged records leaves behind (tansu keeps
nothing over a restart; an unclean leader election truncates a log).

Apache Kafka answers a fetch past the end with OFFSET_OUT_OF_RANGE and the
consumer reads from the start; tansu 0.6 answers it with nothing, and a
worker would wait there for ever while every new copy lands below it (seen
in the tansu restart test).  The group's committed marks are set past the
end here, as the old marks of a restarted server are, and the jobs already
in the log and those enqueued later must run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

import dumbwaiter as dw
from dumbwaiter.testing import drain
from tests.brokers import BROKERS

PAST_THE_END = 1000


async def commit_past_the_end(app: dw.App, queue: str) -> int:
    """Commit ``PAST_THE_END`` for every partition of ``queue``'s topic in
    the workers' group (returns how many partitions)."""
    broker: Any = app.broker
    topic = broker.names.queue_topic(queue)
    consumer = AIOKafkaConsumer(
        **broker.config, group_id=broker.names.jobs_group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer.topics()  # the metadata of every topic
            parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.commit({tp: PAST_THE_END for tp in tps})
        return len(tps)
    finally:
        await consumer.stop()


def test_jobs_run_when_the_group_is_past_the_end_of_the_log(tmp_path: Path) -> None:
    app = dw.App(BROKERS["kafka"](tmp_path))
    ran: list[int] = []

    @app.task
    def job(n: int) -> None:
        ran.append(n)

    async def go() -> None:
        try:
            await app.broker.declare(["default"])
            await job.aenqueue(1)
            await job.aenqueue(2)
            assert await commit_past_the_end(app, "default") > 0
            await drain(app)
            assert sorted(ran) == [1, 2]  # what was in the log
            await job.aenqueue(3)
            await drain(app)
            assert sorted(ran) == [1, 2, 3]  # and what came after
        finally:
            await app.broker.close()

    asyncio.run(go())
