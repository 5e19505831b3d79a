"""The bare aiokafka client in the peers harness: the anchor of the Kafka
run (``benchmarks/kafka_run.sh``), measured by the same runner, workloads
and completion log as the libraries.

* ``aiokafka-bare``: W1 enqueue = ``send_and_wait`` one at a time (acks=all,
  linger 0), W2 = every ``send`` first, then every acknowledgement (one
  pipelined batch), the worker = a ``getmany`` loop that runs each record's
  task body and commits after each batch.  W3 reads with the same
  ``fetch.max.wait.ms`` as dumbwaiter's default (``kafka_common``): tansu
  answers a waiting fetch only after it.
* ``aiokafka-redis-floor``: what dumbwaiter's enqueue on a Redis state
  store cannot go under, the way it does it: the copy handed to the
  producer, a record write to Redis (``SET NX``, one round trip) while it
  is on its way, then the copy's acknowledgement (``jobs.enqueue`` writes
  both at once; a copy that comes first waits for its record in the
  worker); bulk: every send, every record in one pipelined round trip,
  then every acknowledgement.  Same worker as the anchor (its W1 drain and
  W3 are the anchor's again).

The worker process runs ``python -m aiokafka_bare_adapter``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kafka_common import FETCH_WAIT_MS, KAFKA, ensure_topic, new_run, run_id
from peers import tasks
from peers.adapters.base import Adapter
from peers.common import REDIS_URL, redis_flush

BODIES = {"noop": tasks.anoop, "sleep10ms": tasks.asleep10ms}
#: the size of a dumbwaiter record of a no-op job (the envelope and its state)
RECORD = b"r" * 480


def topic() -> str:
    return f"bare-{run_id()}"


def value(task: str, i: int) -> bytes:
    return f"{task} {i}".encode()


class BareKafkaAdapter(Adapter):
    """aiokafka's producer, one topic of 3 partitions, acks=all."""

    name = "aiokafka-bare"
    dists = ("aiokafka",)
    backend = "kafka"
    is_async = True
    default_concurrency = 1  # one getmany loop; the task bodies are no-ops
    bulk = "batch"
    bulk_api = "every producer.send(...) first, then every acknowledgement"
    notes = (
        "the anchor: AIOKafkaProducer acks=all linger_ms=0, send_and_wait one at a time; "
        "worker: AIOKafkaConsumer group, getmany(max_records=500), "
        f"fetch_max_wait_ms={FETCH_WAIT_MS}, commit after each batch"
    )

    def __init__(self) -> None:
        self._producer: Any = None
        self._topic = ""

    async def open(self) -> None:  # type: ignore[override]
        from aiokafka import AIOKafkaProducer

        self._topic = topic()
        await ensure_topic(self._topic)
        self._producer = AIOKafkaProducer(bootstrap_servers=KAFKA, acks="all", linger_ms=0)
        await self._producer.start()

    async def close(self) -> None:  # type: ignore[override]
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def enqueue_one(self, task: str, i: int) -> None:  # type: ignore[override]
        await self._producer.send_and_wait(self._topic, value(task, i), key=str(i).encode())

    async def enqueue_bulk(self, task: str, ids: range) -> None:  # type: ignore[override]
        await self._send_all(task, ids)

    async def _send_all(self, task: str, ids: range) -> None:
        p = self._producer
        futures = [await p.send(self._topic, value(task, i), key=str(i).encode()) for i in ids]
        await asyncio.gather(*futures)

    def reset(self) -> None:
        new_run()

    def worker_cmd(self, concurrency: int) -> list[str]:
        return [self.py(), "-m", "aiokafka_bare_adapter"]


class RedisFloorAdapter(BareKafkaAdapter):
    """The anchor's produce after a Redis record write: the floor of an enqueue."""

    name = "aiokafka-redis-floor"
    dists = ("aiokafka", "redis")
    bulk_api = "the anchor's sends, one pipelined round trip of SET NX meanwhile, then every ack"
    notes = (
        "the floor of dumbwaiter's enqueue on a Redis state store: the anchor's send, SET NX of "
        "a 480-byte record (redis.asyncio, db 1) while it is on its way, then its ack; bulk: "
        "every send, all records in one pipeline meanwhile, then every ack; worker: the anchor's"
    )

    def __init__(self) -> None:
        super().__init__()
        self._redis: Any = None

    async def open(self) -> None:  # type: ignore[override]
        import redis.asyncio as aioredis

        await super().open()
        self._redis = aioredis.Redis.from_url(REDIS_URL)
        await self._redis.ping()

    async def close(self) -> None:  # type: ignore[override]
        await super().close()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    async def enqueue_one(self, task: str, i: int) -> None:  # type: ignore[override]
        sent = await self._producer.send(self._topic, value(task, i), key=str(i).encode())
        await self._redis.set(f"floor:{i}", RECORD, nx=True)
        await sent

    async def enqueue_bulk(self, task: str, ids: range) -> None:  # type: ignore[override]
        p = self._producer
        futures = [await p.send(self._topic, value(task, i), key=str(i).encode()) for i in ids]
        pipe = self._redis.pipeline(transaction=False)
        for i in ids:
            pipe.set(f"floor:{i}", RECORD, nx=True)
        await pipe.execute()
        await asyncio.gather(*futures)

    def reset(self) -> None:
        super().reset()
        redis_flush()


async def work() -> None:
    """The anchor's worker: read, run each body, commit after each batch."""
    from aiokafka import AIOKafkaConsumer

    name = topic()
    await ensure_topic(name)
    c = AIOKafkaConsumer(
        name,
        bootstrap_servers=KAFKA,
        group_id=name,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=FETCH_WAIT_MS,
    )
    await c.start()
    try:
        while True:
            batch = await c.getmany(timeout_ms=1000, max_records=500)
            for recs in batch.values():
                for rec in recs:
                    task, i = rec.value.decode().split()
                    await BODIES[task](int(i))
            if batch:
                await c.commit()
    finally:
        await c.stop()


ADAPTERS: list[Adapter] = [BareKafkaAdapter(), RedisFloorAdapter()] if KAFKA else []

if __name__ == "__main__":
    asyncio.run(work())
