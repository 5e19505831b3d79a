"""The admin's view of a Kafka app: counts, listings, replay and purge over
the job records, the event log read back from its topics, and consumer lag
per partition read from the cluster.

Listings read every record of the app from the state store (Kafka has no
index to ask), as the RabbitMQ broker's do: fine for the admin's pace, not
for a hot path.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from ...message import Message, decode
from ...state import State
from .. import transitions as T
from ..base import KvWrite
from ..listing import jobs_page
from ..partitions import PartitionLag
from ..record import count_states
from ..types import JobFilter, Page, QueueStats, events_page, stats_rows
from .connection import started, stopped
from .engine import KafkaEngine
from .records import Record


async def records(b: KafkaEngine) -> list[Record]:
    return [Record.load(v) for v in (await b.state.kv_scan(b.names.job)).values()]


async def stats(b: KafkaEngine) -> list[QueueStats]:
    n = b.names
    now = await b.now()
    queues = {k[len(n.queue) :] for k in await b.state.kv_scan(n.queue)}
    counts: dict[str, dict[str, float]] = {q: {} for q in queues}
    count_states(await records(b), now, counts)
    paused = {k[len(n.paused) :] for k in await b.state.kv_scan(n.paused)}
    return stats_rows(counts, paused)


async def list_jobs(b: KafkaEngine, filter: JobFilter, cursor: str | None, limit: int) -> Page:
    now = await b.now()
    infos = [r.info(now) for r in await records(b)]
    return jobs_page((i for i in infos if filter.matches(i)), cursor, limit)


async def replay(b: KafkaEngine, filter: JobFilter) -> int:
    """Dead jobs matching ``filter`` get fresh attempts and a new copy."""
    n = b.names
    now = await b.now()
    ids = [
        r.msg.id for r in await records(b) if r.state is State.DEAD and filter.matches(r.info(now))
    ]
    if not ids:
        return 0

    def decide(got: dict[str, bytes]) -> tuple[dict[str, KvWrite], list[Record]]:
        writes: dict[str, KvWrite] = {}
        out = []
        for i in ids:
            raw = got.get(n.job + i)
            if raw is None:
                continue
            rec = Record.load(raw)
            if not T.replay(rec, now):
                continue
            writes[n.job + i] = rec.dump()
            out.append(rec)
        return writes, out

    changed = await b.state.kv_update([n.job + i for i in ids], decide)
    await b.send([c for r in changed for c in b.copy_of(r.msg, r.ver, now, now)])
    return len(changed)


async def purge(b: KafkaEngine, filter: JobFilter) -> int:
    n = b.names
    now = await b.now()
    gone = [
        r for r in await records(b) if r.state is not State.RUNNING and filter.matches(r.info(now))
    ]
    if not gone:
        return 0
    keys = [n.job + r.msg.id for r in gone]
    held = {n.key + r.msg.key: r.msg.id for r in gone if r.msg.key is not None}
    if held:
        owners = await b.state.kv_get(list(held))
        keys += [k for k, v in owners.items() if v.decode() == held[k]]
    await b.state.kv_delete(keys)
    return len(gone)


# -- the event log ---------------------------------------------------------------------------


async def list_events(
    b: KafkaEngine,
    event_type: str,
    since: float | None,
    until: float | None,
    cursor: str | None,
    limit: int,
) -> tuple[list[Message], str | None]:
    """Events of a type published in ``[since, until]`` (the records' own
    times), oldest first by id, read back from the type's topic."""
    topic = b.names.event_topic(event_type)
    logged: list[tuple[float, Message]] = []
    for rec_time, value in await read_topic(b, topic):
        try:
            logged.append((rec_time, decode(value)))
        except ValueError:
            continue  # not an event of ours
    return events_page(logged, since, until, cursor, limit)


async def read_topic(b: KafkaEngine, topic: str) -> list[tuple[float, bytes]]:
    """Every record of ``topic`` (its time, its value), read without a group
    from each partition's first offset until the reads come back empty.

    Not up to the end offsets: tansu 0.6 answers a ListOffsets after a
    batched produce with the batch's first offset, not one past its last."""
    consumer = AIOKafkaConsumer(
        **b.config, enable_auto_commit=False, fetch_max_wait_ms=50, auto_offset_reset="earliest"
    )
    try:
        await started(consumer)  # (one cancelled midway leaves nothing open)
        await consumer.topics()  # the cluster's metadata (this consumer follows no topic)
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)  # before the first kept: reset to the earliest
        out: list[tuple[float, bytes]] = []
        empty = 0
        while empty < EMPTY_READS:
            got = await consumer.getmany(timeout_ms=READ_MS)
            empty = 0 if got else empty + 1
            for recs in got.values():
                out += [(_published(rec), rec.value or b"") for rec in recs]
        return out
    finally:
        await stopped(consumer)


def _published(rec: Any) -> float:
    """When an event was published: its ``dw-at`` header (microseconds), else
    the record's own time (milliseconds: Kafka's precision)."""
    for k, v in rec.headers or ():
        if k == "dw-at":
            try:
                return float(bytes(v))
            except ValueError:
                break
    return float(rec.timestamp) / 1000.0


#: a topic is read to its end once this many reads of ``READ_MS`` found nothing
EMPTY_READS = 2
READ_MS = 150


# -- consumer lag --------------------------------------------------------------------------


async def lag(b: KafkaEngine) -> list[PartitionLag]:
    """Per queue and partition: the end offset, the jobs group's committed
    offset and the difference (copies not judged yet)."""
    n = b.names
    queues = sorted(k[len(n.queue) :] for k in await b.state.kv_scan(n.queue))
    consumer = AIOKafkaConsumer(**b.config, group_id=n.jobs_group, enable_auto_commit=False)
    try:
        await started(consumer)  # (one cancelled midway leaves nothing open)
        await consumer.topics()
        out: list[PartitionLag] = []
        for q in queues:
            topic = n.queue_topic(q)
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            if not tps:
                continue
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                committed = await consumer.committed(tp)
                out.append(PartitionLag(q, tp.partition, ends[tp], committed or 0))
        return out
    finally:
        await stopped(consumer)
