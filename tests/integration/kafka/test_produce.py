"""Many copies written at once (``kafka/produce.py``, ``jobs.enqueue``'s
chunks): each key's records land in the partition the client's own
partitioner gives that key (where any other producer's records of the key
go), in the order they were sent, and a bulk enqueue of more jobs than one
chunk runs every job once, each copy with the headers of its own job
(``copy_of`` shares the headers a kind of copy has in common)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import DefaultPartitioner

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.kafka import KafkaBroker
from dumbwaiter.brokers.kafka.belief import record_of
from dumbwaiter.brokers.kafka.jobs import CHUNK
from dumbwaiter.brokers.kafka.names import tier_for
from dumbwaiter.brokers.kafka.produce import BATCH_FROM
from dumbwaiter.testing import drain
from tests.brokers import BROKERS
from tests.conformance import test_events  # its ``event``; not its fixtures
from tests.conformance.conftest import msg
from tests.integration.kafka.copies import first_copies
from tests.integration.kafka.server import bootstrap

KEYS = ("alpha", "beta", "gamma", "delta")


async def test_published_events_keep_each_keys_partition_and_order(tmp_path: Path) -> None:
    broker = from_url(BROKERS["kafka"](tmp_path))
    assert isinstance(broker, KafkaBroker)
    try:
        # one publish of 40: written in record batches
        events = [test_events.event(key=KEYS[i % 4], n=i) for i in range(40)]
        await broker.publish(events)
        consumer = AIOKafkaConsumer(
            broker.names.event_topic("order.created"),
            bootstrap_servers=bootstrap(),
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            got: list[tuple[int, bytes, str]] = []
            while len(got) < len(events):
                for tp, recs in (await consumer.getmany(timeout_ms=1000)).items():
                    got += [(tp.partition, r.key or b"", _id(r.headers)) for r in recs]
        finally:
            await consumer.stop()
        parts = sorted({p for p, _, _ in got} | set(range(broker.partitions)))
        for key in KEYS:
            mine = [(p, i) for p, k, i in got if k == key.encode()]
            want = DefaultPartitioner()(key.encode(), parts, parts)
            assert {p for p, _ in mine} == {want}
            assert [i for _, i in mine] == [e.id for e in events if e.key == key]
    finally:
        await broker.close()


def _id(headers: Sequence[tuple[str, bytes]]) -> str:
    return dict(headers)["dw-id"].decode()


async def test_a_bulk_enqueue_larger_than_a_chunk_runs_every_job_once(tmp_path: Path) -> None:
    app = dw.App(BROKERS["kafka"](tmp_path))
    ran: list[int] = []

    @app.task
    async def job(i: int) -> None:
        ran.append(i)

    try:
        n = 2 * CHUNK + 7
        jobs = await job.aenqueue_many(range(n))
        assert len({j.id for j in jobs}) == n
        await drain(app, timeout=60)
        assert sorted(ran) == list(range(n))
    finally:
        await app.aclose()


async def test_each_copy_of_a_bulk_enqueue_carries_its_own_jobs_headers(tmp_path: Path) -> None:
    """Copies of one bulk enqueue share the headers they have in common; a
    job of another priority or run time in the same call gets its own, and
    each first copy still rebuilds the record written for its job."""
    broker = from_url(BROKERS["kafka"](tmp_path))
    assert isinstance(broker, KafkaBroker)
    try:
        eta = time.time() + 60
        ready = [msg(priority=i % 3, args=[i]) for i in range(2 * BATCH_FROM)]
        later = [msg(eta=eta, args=[-1]), msg(eta=eta + 0.5, priority=2, args=[-2])]
        await broker.enqueue(ready[:BATCH_FROM] + later + ready[BATCH_FROM:])
        got = await first_copies(broker, broker.names.queue_topic("default"), len(ready))
        got += await first_copies(broker, broker.names.tier_topic(tier_for(59.0)), len(later))
        by_id = {c.header("dw-id") or "": c for c in got}
        assert sorted(by_id) == sorted(m.id for m in ready + later)
        records = await broker.state.kv_get([broker.names.job + m.id for m in ready + later])
        for m in ready + later:
            c = by_id[m.id]
            assert c.header("dw-p") == str(m.priority)
            rec = record_of(c)
            assert rec is not None
            assert rec.msg.args == m.args
            assert rec.dump() == records[broker.names.job + m.id]  # its own run time too
    finally:
        await broker.close()
