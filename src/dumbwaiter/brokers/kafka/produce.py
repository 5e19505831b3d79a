"""Writing many copies at once: record batches built here, one per
partition, instead of one ``send`` per copy.

``AIOKafkaProducer.send`` is a coroutine and a future per record, and finds
the record's partition and batch each time; a bulk enqueue of thousands of
jobs spent more in those calls than in anything else of its own.  Here the
copies are grouped by partition first (``partition_of``: a key's copies
keep their order), each group filled into as few batches (``create_batch``,
the producer's batch size) as fit, and each batch handed over with
``send_batch``: one coroutine and one future per batch.

``Sending`` is copies handed to the producer and not yet acknowledged: an
enqueue starts its copies on their way, writes its records meanwhile, and
waits for the acknowledgement last (``jobs.enqueue``).

``in_view`` keeps the producer's view of the cluster whole: see there.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

#: copies of one ``send`` from which it goes through batches (below, the
#: per-record ``send`` costs no more, and one copy needs no grouping)
BATCH_FROM = 16

Item = tuple[str, bytes, bytes, list[tuple[str, bytes]]]


_partitioner = DefaultPartitioner()


def partition_of(key: bytes, headers: Sequence[tuple[str, bytes]], parts: Sequence[int]) -> int:
    """The partition of a copy, of the sorted ``parts`` of its topic.  A key
    of the user's (a task's unique key, an event's key) goes where the
    client's own partitioner puts it, as any other producer's records of
    that key do.  A copy keyed by its job's own id (its first header,
    ``dw-id``) goes by a CRC-32 of it: no other producer writes that key,
    and the client's murmur2 is pure Python, a large share of a bulk
    enqueue's time (docs/benchmarks.md, h-kprod)."""
    if headers and headers[0][0] == "dw-id" and headers[0][1] == key:
        return parts[zlib.crc32(key) % len(parts)]
    return int(_partitioner(key, parts, parts))


#: looks at the cluster's topics before a copy goes to one the producer
#: does not know (a topic just made reaches every broker's metadata a
#: moment after its creation returns)
VIEW_TRIES = 5
VIEW_PAUSE = 0.2


async def in_view(
    producer: AIOKafkaProducer,
    topics: Iterable[str],
    remake: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Make the producer know ``topics`` before a copy goes to them, keeping
    its client asking the cluster for *every* topic.

    aiokafka's producer starts out asking for every topic, and answers a
    send to a topic it already knows without adding that topic to the ones
    it asks for.  The first send to a topic it does not know makes that
    topic the only one it asks for (``AIOKafkaClient.add_topic``), and the
    next answer forgets every other topic: a copy handed over in that moment
    waits for its partition's leader until the request times out, and an
    enqueue inside a worker (a batch's callback) waited 40 s.  Asking for
    every topic again (``set_topics(())``) until the new one is in the
    answer never narrows the view; and it never names a topic, which a
    cluster that creates topics on demand (tansu, Kafka with
    ``auto.create.topics.enable``) would create with its own partition
    count.  ``remake`` makes again the topics the cluster lost (the broker's
    ``Topics.check``): a topic still missing after one look is one a
    restarted server forgot, made again here with the partitions it was
    made with."""
    cluster = producer.client.cluster
    missing = [t for t in topics if cluster.partitions_for_topic(t) is None]
    for attempt in range(VIEW_TRIES):
        if not missing:
            return
        if attempt:
            if attempt == 1 and remake is not None:
                await remake()
            await asyncio.sleep(VIEW_PAUSE)
        await producer.client.set_topics(())
        missing = [t for t in missing if cluster.partitions_for_topic(t) is None]
    # still unknown: the send asks for it by name (aiokafka's own way)


async def send_one(producer: AIOKafkaProducer, item: Item) -> asyncio.Future[object]:
    """Hand one copy to ``producer``; the future resolves when the cluster
    acknowledged it."""
    topic, key, value, headers = item
    parts = sorted(await producer.partitions_for(topic))
    partition = partition_of(key, headers, parts)
    sent: asyncio.Future[object] = await producer.send(
        topic, value, key=key, headers=headers, partition=partition
    )
    return sent


async def send_batched(
    producer: AIOKafkaProducer, items: Sequence[Item]
) -> list[asyncio.Future[object]]:
    """Hand ``items`` (topic, key, value, headers) to ``producer`` in
    batches; the futures resolve when the cluster acknowledged each batch."""
    parts: dict[str, list[int]] = {}
    groups: dict[tuple[str, int], list[Item]] = {}
    for item in items:
        topic, key, _, headers = item
        known = parts.get(topic)
        if known is None:
            known = parts[topic] = sorted(await producer.partitions_for(topic))
        groups.setdefault((topic, partition_of(key, headers, known)), []).append(item)
    futures: list[asyncio.Future[object]] = []
    for (topic, partition), group in groups.items():
        batch = producer.create_batch()
        for _, key, value, headers in group:
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()  # an empty batch takes any first record
                batch.append(key=key, value=value, timestamp=None, headers=headers)
        futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures


class Sending:
    """Copies handed to the producer (``futures``: one per record or batch,
    None when the hand-over failed in a way worth trying again), waited for
    later.  ``again``: the whole write of ``items`` with its retries, for a
    hand-over or an acknowledgement that failed as "unavailable" (which
    ``retriable`` says of an error; any other is raised).  Copies written
    twice that way are judged by their records: each job runs once."""

    __slots__ = ("again", "futures", "items", "retriable")

    def __init__(
        self,
        futures: list[asyncio.Future[object]] | None,
        items: Sequence[Item],
        again: Callable[[Sequence[Item]], Awaitable[None]],
        retriable: Callable[[BaseException], bool],
    ) -> None:
        self.futures = futures
        self.items = items
        self.again = again
        self.retriable = retriable

    async def wait(self) -> None:
        """Until the cluster acknowledged every copy."""
        if self.futures is not None:
            try:
                for f in self.futures:  # all on their way: one wait after another
                    await f
                return
            except Exception as exc:
                self.abandon()  # the others' outcomes: the write below decides
                if not self.retriable(exc):
                    raise
        await self.again(self.items)

    def abandon(self) -> None:
        """Not waited for (the call failed): their outcome is not reported."""
        for f in self.futures or ():
            if f.done():
                _seen(f)
            else:
                f.add_done_callback(_seen)


def _seen(f: asyncio.Future[object]) -> None:
    if not f.cancelled():
        f.exception()  # retrieved: not logged as "never retrieved"
