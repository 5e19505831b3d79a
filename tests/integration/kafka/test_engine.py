"""What the Kafka broker promises beyond the conformance suite: the state
store's rules and announcement, offset leases, dead letters' headers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.kafka import KafkaBroker
from dumbwaiter.brokers.types import Delivery
from tests.conformance.conftest import msg
from tests.conformance.helpers import error, until_fetch_waits
from tests.integration.kafka.server import bootstrap, needs_apache_kafka, new_prefix, url
from tests.integration.redis.server import new_prefix as redis_prefix
from tests.integration.redis.server import url as redis_url


def _kafka(prefix: str, state: str | None = None, **options: str) -> str:
    state = state or redis_url(redis_prefix())
    return url(prefix, state, session_timeout="2", **options)


def test_a_single_host_state_store_is_refused_unless_the_url_says_so(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path}/state.db"
    with pytest.raises(dw.InvalidURL) as info:
        dw.App(f"kafka://127.0.0.1:9092?state={quote(sqlite, safe='')}")
    text = str(info.value)
    assert "only one machine can share" in text and "single_host=true" in text
    b = from_url(f"kafka://127.0.0.1:9092?state={quote(sqlite, safe='')}&single_host=true")
    assert b.capabilities.multi_host is False
    with pytest.raises(dw.InvalidURL, match="names no state store"):
        dw.App("kafka://127.0.0.1:9092")


async def test_a_second_state_store_is_refused_naming_both() -> None:
    prefix = new_prefix()
    first = from_url(_kafka(prefix))
    second = from_url(_kafka(prefix))  # another Redis prefix: another store
    try:
        await first.enqueue([msg()])
        with pytest.raises(dw.StateStoreConflict) as info:
            await second.enqueue([msg()])
        assert info.value.theirs is not None and info.value.ours != info.value.theirs
        # the refused process wrote nothing to its own store
        assert await second._store.kv_scan("_kafka") == {}  # type: ignore[attr-defined]
    finally:
        await first.close()
        await second.close()


async def test_the_committed_offset_is_the_low_water_mark_of_judged_copies() -> None:
    """A long job does not hold back the commit of later copies; copies read
    and not judged do; a copy read again after a restart is judged by the
    record (the running job is not handed out twice)."""
    prefix = new_prefix()
    u = _kafka(prefix, partitions="1")
    a = from_url(u)
    assert isinstance(a, KafkaBroker)
    try:
        long_job, quick = msg(), msg()
        await a.enqueue([long_job])
        await a.enqueue([quick])
        [held] = await a.fetch(["default"], 1, 60.0, 0)  # the quick one stays buffered
        assert held.id == long_job.id
        assert [p.committed for p in await a.partition_lag()] == [1]
        [d] = await a.fetch(["default"], 1, 60.0, 0)
        await a.ack([d])
        assert [(p.end, p.committed) for p in await a.partition_lag()] == [
            (2, 2)
        ]  # past the long job
        three = [msg() for _ in range(3)]
        await a.enqueue(three)
        [first] = await a.fetch(["default"], 1, 60.0, 0)
        assert first.id == three[0].id
        assert [p.committed for p in await a.partition_lag()] == [3]  # two read, not judged
    finally:
        await a.close()
    b = from_url(u)
    try:
        got = []
        while ds := await b.fetch(["default"], 10, 60.0, 0):
            got += [d.id for d in ds]
        assert sorted(got) == sorted(m.id for m in three[1:])  # not `first`, not the long job
        info = await b.get(long_job.id)
        assert info is not None and info.state is dw.State.RUNNING
    finally:
        await b.close()


async def test_a_dead_letter_carries_its_error_history_in_headers() -> None:
    prefix = new_prefix()
    b = from_url(_kafka(prefix))
    assert isinstance(b, KafkaBroker)
    try:
        m = msg(queue="mail")
        await b.enqueue([m])
        [d] = await b.fetch(["mail"], 1, 30.0, 0)
        d.error = error(kind="builtins.KeyError", message="no such key")
        await b.dead([d])
    finally:
        await b.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap(), enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()
        topic = b.names.dlq_topic("mail")
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 20
        found: list[Any] = []
        while not found and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=200)).values():
                found += recs
    finally:
        await consumer.stop()
    [rec] = found
    headers = dict(rec.headers)
    assert headers["dw-id"] == m.id.encode()
    assert headers["x-dw-error-type"] == b"builtins.KeyError"
    assert orjson.loads(headers["x-dw-errors"]) == [
        {"attempt": 1, "type": "builtins.KeyError", "message": "no such key"}
    ]
    assert orjson.loads(rec.value)["id"] == m.id


@needs_apache_kafka("wake a waiting fetch when a record arrives")
async def test_a_waiting_fetch_wakes_on_enqueue_without_polling() -> None:
    """``capabilities.blocking_fetch``: with the cluster holding an empty
    fetch for a minute (``fetch_wait=60``), a job enqueued meanwhile still
    reaches the waiting fetch at once: the cluster answers when data comes."""
    u = _kafka(new_prefix(), fetch_wait="60")
    consumer, producer = from_url(u), from_url(u)
    try:
        await consumer.fetch(["default"], 1, 30.0, 0)  # joined its group
        fetching = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 120.0))
        await until_fetch_waits(consumer)
        m = msg()
        await producer.enqueue([m])
        ds = await asyncio.wait_for(fetching, 10)
        assert [d.id for d in ds] == [m.id]
    finally:
        await consumer.close()
        await producer.close()


async def test_a_foreign_record_on_a_queue_topic_is_handed_over_to_be_dead_lettered() -> None:
    """A record a foreign producer put on a queue's topic (no dw-id header)
    is handed to the worker as an undecodable body (``message`` None, its
    bytes as ``raw``, the reason), to be dead-lettered like one on any
    broker (``brokers/kafka/foreign.py``); the job behind it runs."""
    from aiokafka import AIOKafkaProducer

    prefix = new_prefix()
    b = from_url(_kafka(prefix, partitions="1"))
    assert isinstance(b, KafkaBroker)
    try:
        await b.declare(["default"])
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap())
        await producer.start()
        try:
            await producer.send_and_wait(b.names.queue_topic("default"), b"\xff not ours")
        finally:
            await producer.stop()
        job = msg()
        await b.enqueue([job])
        got: list[Delivery] = []
        while len(got) < 2:
            got += await b.fetch(["default"], 10, 60.0, 1.0)
        [stranger] = [d for d in got if d.message is None]
        assert stranger.raw == b"\xff not ours" and stranger.decode_error
        assert [d.id for d in got if d.message is not None] == [job.id]
        assert await b.fetch(["default"], 1, 60.0, 0) == []  # nothing else to run
    finally:
        await b.close()


async def test_a_write_of_copies_that_meets_a_restarting_cluster_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarting cluster answers a produce with errors that say "not
    now" (tansu's UnknownError while it comes back; a leader moving on a
    real cluster). The enqueue tries again within its deadline instead of
    failing the producer's call, and the job runs once even if the first
    write had landed."""
    from aiokafka.errors import UnknownError

    u = _kafka(new_prefix())
    producer, worker = from_url(u), from_url(u)
    assert isinstance(producer, KafkaBroker)
    real = producer._hand_over
    failed: list[Any] = []

    async def landed_then_failed(items: Any) -> list[asyncio.Future[object]]:
        futures = await real(items)
        if failed:
            return futures
        failed.append(items)
        await asyncio.gather(*futures)  # the copy is in the topic ...
        lost: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        lost.set_exception(UnknownError("the server is coming back"))  # ... and the answer was lost
        return [lost]

    monkeypatch.setattr(producer, "_hand_over", landed_then_failed)
    try:
        m = msg()
        assert await producer.enqueue([m]) == [m.id]
        assert failed, "the write did not fail"
        [d] = await worker.fetch(["default"], 10, 30.0, 20.0)
        assert d.id == m.id
        await worker.ack([d])
        # the second copy of the same job is judged by its record: dropped
        assert await worker.fetch(["default"], 10, 30.0, 1.0) == []
    finally:
        await worker.close()
        await producer.close()
