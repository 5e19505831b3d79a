"""Writing many copies at once: record batches built here, one per
partition, instead of one ``send`` per copy.

``AIOKafkaProducer.send`` is a coroutine and a future per record, and finds
the record's partition and batch each time; a bulk enqueue of thousands of
jobs spent more in those calls than in anything else of its own.  Here the
copies are grouped by partition first (the producer's own partitioner on
the same key, so a copy lands where ``send`` would put it, and a key's
copies keep their order), each group filled into as few batches
(``create_batch``, the producer's batch size) as fit, and each batch handed
over with ``send_batch``: one coroutine and one future per batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

#: copies of one ``send`` from which it goes through batches (below, the
#: per-record ``send`` costs no more, and one copy needs no grouping)
BATCH_FROM = 16

Item = tuple[str, bytes, bytes, list[tuple[str, bytes]]]


async def send_batched(
    producer: AIOKafkaProducer, items: Sequence[Item]
) -> list[asyncio.Future[object]]:
    """Hand ``items`` (topic, key, value, headers) to ``producer`` in
    batches; the futures resolve when the cluster acknowledged each batch."""
    partitioner = DefaultPartitioner()
    parts: dict[str, list[int]] = {}
    groups: dict[tuple[str, int], list[Item]] = {}
    for item in items:
        topic, key = item[0], item[1]
        known = parts.get(topic)
        if known is None:
            known = parts[topic] = sorted(await producer.partitions_for(topic))
        groups.setdefault((topic, partitioner(key, known, known)), []).append(item)
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
