"""Key layout: every key an app makes is under its prefix, in one cluster slot."""

from __future__ import annotations

import asyncio
import time

import redis
from redis.crc import key_slot

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import Binding, JobFilter
from dumbwaiter.state import State
from tests.conformance.conftest import msg
from tests.conformance.helpers import error, eventually, until_fetch_waits
from tests.conformance.test_events import event

from .conftest import RedisServer


async def _every_transition(broker: Broker, other: Broker) -> None:
    """Touch every kind of key: jobs in each state, waiters and inboxes,
    unique keys, locks, the kv store, paused queues, event streams."""
    await broker.enqueue([msg(), msg(key="k1"), msg(eta=time.time() + 3600), msg(queue="q2")])
    ds = await broker.fetch(["default"], 2, 30.0, 0, "w1")
    ds[0].result, ds[0].result_ttl = b'{"value": 1}', 60.0
    await broker.ack(ds[:1])
    ds[1].error, ds[1].retry_at = error(), time.time() + 60
    await broker.retry(ds[1:])
    [d] = await broker.fetch(["q2"], 1, 0.1, 0, "w2")
    await broker.extend([d], 0.1)
    assert await eventually(broker.rescue, lambda n: n > 0) == 1  # once its lease ran out
    [d] = await broker.fetch(["q2"], 1, 30.0, 0, "w2")
    d.error = error()
    await broker.dead([d])
    # an idle worker waiting on two queues, handed a job by an enqueue
    waiting = asyncio.create_task(other.fetch(["default", "q3"], 5, 30.0, 10.0, "w3"))
    await until_fetch_waits(other, "q3")
    await broker.enqueue([msg(queue="q3")])
    [handed] = await asyncio.wait_for(waiting, 10)
    await broker.requeue([handed])
    await broker.cancel([handed.id])
    await broker.replay(JobFilter(state=State.DEAD))
    await broker.pause("q4")
    await broker.resume("q4")
    await broker.declare(["q5"])
    token = await broker.acquire("leader", "me", 30.0)
    assert token is not None
    await broker.renew("leader", "me", token, 30.0)
    await broker.kv_set({"a": b"1", "b": b"2"}, ttl=60)
    await broker.kv_add("c", b"3")
    await broker.kv_incr("n", 5)
    # events: a stream, its consumer groups, jobs read from them, the trimming
    await broker.declare(["group:g"], [Binding("order.created", "group:g")])
    await broker.publish([event(), event("order.paid")])
    broker.publish_sync([event()])
    [d] = await broker.fetch(["group:g"], 1, 30.0, 0, "w4")
    await broker.ack([d])
    await broker.list_events("order.created")
    broker.event_retention = -60.0  # everything published is past its retention
    await broker.rescue()
    await broker.stats()
    await broker.list_jobs(JobFilter(), None, 10)
    await broker.purge(JobFilter(queue="q2"))


async def test_every_key_is_under_the_prefix_in_one_slot(redis_server: RedisServer) -> None:
    url = redis_server.url(prefix="app1")
    broker, other = from_url(url), from_url(url)
    try:
        await _every_transition(broker, other)
    finally:
        await broker.close()
        await other.close()
    client = redis.Redis(port=redis_server.port)
    try:
        keys = list(client.scan_iter(count=1000))
    finally:
        client.close()
    assert len(keys) > 15
    assert all(k.startswith(b"{dw:app1}:") for k in keys), keys
    assert {key_slot(k) for k in keys} == {key_slot(b"{dw:app1}")}


async def test_apps_with_other_prefixes_do_not_meet(redis_server: RedisServer) -> None:
    a, b = from_url(redis_server.url(prefix="a")), from_url(redis_server.url(prefix="b"))
    try:
        await a.enqueue([msg()])
        assert await b.fetch(["default"], 10, 30.0, 0) == []
        assert await b.stats() == []
        assert len(await a.fetch(["default"], 10, 30.0, 0)) == 1
    finally:
        await a.close()
        await b.close()
