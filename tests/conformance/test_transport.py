"""Transport: enqueue, fetch with lease, ack, retry, dead, requeue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import fields

from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import Capabilities
from dumbwaiter.state import State
from tests.brokers import CAPABILITIES

from .conftest import msg
from .helpers import error, fetch_all, until_fetch_waits


def test_the_broker_reports_the_capabilities_it_must(broker: Broker, broker_name: str) -> None:
    """The flags ``tests/brokers.py`` lists for this broker: the layers
    above branch on them, and the tests that need one run only where it is
    reported."""
    reported = {
        f.name for f in fields(Capabilities) if getattr(broker.capabilities, f.name) is True
    }
    assert CAPABILITIES[broker_name] <= reported
    # multi_host both ways: a single-host broker that claimed it would let
    # a deployment run processes on two machines over two truths
    assert broker.capabilities.multi_host is ("multi_host" in CAPABILITIES[broker_name])


async def test_enqueue_then_fetch_returns_the_envelope(broker: Broker) -> None:
    m = msg(args=[1, "two", {"three": [3]}], kwargs={"k": None}, headers={"h": "v"}, priority=3)
    assert await broker.enqueue([m]) == [m.id]
    [d] = await broker.fetch(["default"], 10, 30.0, 0)
    got = d.message
    assert got is not None
    assert (got.id, got.name, got.queue, got.args, got.kwargs, got.headers) == (
        m.id,
        m.name,
        "default",
        [1, "two", {"three": [3]}],
        {"k": None},
        {"h": "v"},
    )
    assert got.attempt == 1
    assert got.max_attempts == 4
    assert d.lease_until > time.time()
    assert await broker.fetch(["default"], 10, 30.0, 0) == []


async def test_fetch_honours_limit_and_queues(broker: Broker) -> None:
    await broker.enqueue([msg() for _ in range(5)] + [msg(queue="other") for _ in range(3)])
    assert len(await broker.fetch(["default"], 2, 30.0, 0)) == 2
    assert len(await broker.fetch(["default"], 10, 30.0, 0)) == 3
    ds = await broker.fetch(["nothing-here", "other"], 10, 30.0, 0)
    assert {d.queue for d in ds} == {"other"} and len(ds) == 3


async def test_fetch_oldest_first_within_a_priority(broker: Broker) -> None:
    ms = [msg(args=[i]) for i in range(20)]
    for m in ms:  # one at a time, so each has its own enqueue time
        await broker.enqueue([m])
    got = [d.message.args[0] for d in await fetch_all(broker) if d.message]
    assert got == list(range(20))


async def test_idle_fetch_blocks_and_wakes_on_enqueue(make_broker: Callable[[], Broker]) -> None:
    consumer, producer = make_broker(), make_broker()
    await consumer.open()
    await producer.open()
    fetching = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0))
    await until_fetch_waits(consumer)
    assert not fetching.done()  # it did not return empty-handed
    m = msg()
    await producer.enqueue([m])
    # woken by the enqueue, long before its 60 s wait would end
    ds = await asyncio.wait_for(fetching, 10)
    assert [d.id for d in ds] == [m.id]


async def test_fetch_returns_empty_after_wait(broker: Broker) -> None:
    assert await broker.fetch(["default"], 10, 30.0, 0.05) == []


async def test_ack_marks_succeeded_and_is_safe_to_repeat(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.result = b'{"value": 42}'
    d.result_ttl = 60.0
    await broker.ack([d])
    await broker.ack([d])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED
    assert info.result == b'{"value": 42}'
    assert await broker.fetch(["default"], 1, 30.0, 0) == []


async def test_retry_records_error_and_makes_ready_at_the_time(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error = error()
    d.retry_at = time.time() + 0.3
    await broker.retry([d])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.RETRYING
    assert [e.type for e in info.message.errors] == ["builtins.ValueError"]
    assert await broker.fetch(["default"], 1, 30.0, 0) == []  # not before its time
    [again] = await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 30.0), 10)
    assert again.id == m.id
    assert again.message is not None and again.message.attempt == 2
    assert time.time() >= d.retry_at
    assert [e.message for e in again.message.errors] == ["boom"]


async def test_retry_now_is_ready_at_once(broker: Broker) -> None:
    await broker.enqueue([msg()])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error, d.retry_at = error(), 0.0
    await broker.retry([d])
    [again] = await broker.fetch(["default"], 1, 30.0, 0)
    assert again.message is not None and again.message.attempt == 2


async def test_dead_keeps_every_attempts_error(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    for attempt in (1, 2):
        [d] = await broker.fetch(["default"], 1, 30.0, 0)
        d.error, d.retry_at = error(message=f"fail {attempt}", attempt=attempt), 0.0
        await broker.retry([d])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    d.error = error(kind="builtins.KeyError", message="last", attempt=3)
    await broker.dead([d])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.DEAD
    errs = info.message.errors
    assert [(e.message, e.attempt) for e in errs] == [("fail 1", 1), ("fail 2", 2), ("last", 3)]
    assert errs[-1].type == "builtins.KeyError"
    assert errs[-1].worker == "test-worker" and "Traceback" in errs[-1].traceback
    assert await broker.fetch(["default"], 1, 30.0, 0) == []


async def test_requeue_does_not_charge_the_attempt(broker: Broker) -> None:
    m = msg()
    await broker.enqueue([m])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.requeue([d])
    [again] = await broker.fetch(["default"], 1, 30.0, 0)
    assert again.id == m.id
    assert again.message is not None and again.message.attempt == 1
    info = await broker.get(m.id)
    assert info is not None and info.message.errors == []


async def test_stale_delivery_cannot_settle(broker: Broker) -> None:
    """After a requeue, the old delivery's ack/retry/dead are ignored (fencing)."""
    m = msg()
    await broker.enqueue([m])
    [old] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.requeue([old])
    [new] = await broker.fetch(["default"], 1, 30.0, 0)
    old.error = error()
    await broker.ack([old])
    await broker.dead([old])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.RUNNING
    await broker.ack([new])
    info = await broker.get(m.id)
    assert info is not None and info.state is State.SUCCEEDED


async def test_batch_calls_settle_many(broker: Broker) -> None:
    ms = [msg(args=[i]) for i in range(30)]
    await broker.enqueue(ms)
    ds = await fetch_all(broker)
    assert len(ds) == 30
    acks, retries, deads = ds[:10], ds[10:20], ds[20:]
    for d in retries:
        d.error, d.retry_at = error(), time.time() + 3600
    for d in deads:
        d.error = error()
    await broker.ack(acks)
    await broker.retry(retries)
    await broker.dead(deads)
    [stats] = await broker.stats()
    assert (stats.succeeded, stats.retrying, stats.dead, stats.running) == (10, 10, 10, 0)
    assert stats.scheduled == 0  # a retry is counted as retrying, not as scheduled


async def test_no_job_is_fetched_twice_by_concurrent_fetchers(
    make_broker: Callable[[], Broker],
) -> None:
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    ms = [msg(args=[i]) for i in range(400)]
    await brokers[0].enqueue(ms)

    async def drain(b: Broker) -> list[str]:
        got: list[str] = []
        while True:
            ds = await b.fetch(["default"], 7, 30.0, 0)
            if not ds:
                return got
            got += [d.id for d in ds]

    results = await asyncio.gather(*(drain(b) for b in brokers))
    every = [i for r in results for i in r]
    assert len(every) == len(set(every)) == 400


async def test_cancelled_fetch_leaves_nothing_leased(make_broker: Callable[[], Broker]) -> None:
    consumer, producer = make_broker(), make_broker()
    await consumer.open()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0))
    await until_fetch_waits(consumer)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    m = msg()
    await producer.enqueue([m])
    [d] = await consumer.fetch(["default"], 10, 30.0, 0)
    assert d.id == m.id and d.message is not None and d.message.attempt == 1
