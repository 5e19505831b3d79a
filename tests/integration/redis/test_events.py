"""Events on Redis: the streams and consumer groups a user sees in redis-cli,
trimming that never drops an event a live group has not read (and is not
held back by a group nobody reads), de-duplication on both publish
paths, idle workers woken by a publish, groups that lost their place, and a
restart of the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
import redis
import redis.asyncio

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.redis.broker import RedisBroker
from dumbwaiter.brokers.types import Binding
from tests.conformance.helpers import eventually, fetch_all
from tests.conformance.test_events import event
from tests.integration.redis.server import SERVER, new_prefix, url

from .conftest import RedisServer


@pytest.fixture
def prefix() -> str:
    return new_prefix()


@pytest.fixture
async def broker(prefix: str) -> AsyncIterator[RedisBroker]:
    b = from_url(url(prefix))
    assert isinstance(b, RedisBroker)
    await b.open()
    yield b
    await b.close()


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(SERVER)
    yield c
    c.close()


def _groups(client: redis.Redis, stream: str) -> dict[str, dict[str, Any]]:
    return {g["name"].decode(): g for g in client.xinfo_groups(stream)}


async def _bind(broker: Broker, *queues: str, type_: str = "order.created") -> None:
    await broker.declare(list(queues), [Binding(type_, q, 3) for q in queues])


async def test_a_stream_per_type_and_a_consumer_group_per_subscriber_group(
    broker: RedisBroker, prefix: str, client: redis.Redis
) -> None:
    await _bind(broker, "group:email", "group:billing")
    events = [event(n=i) for i in range(3)]
    assert await broker.publish(events) == 6
    stream = f"{{dw:{prefix}}}:ev:order.created"
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(stream))
    assert [e[1][b"i"].decode() for e in entries] == [e.id for e in events]
    groups = _groups(client, stream)
    assert set(groups) == {"group:email", "group:billing"}
    assert groups["group:email"]["lag"] == 3

    [email] = [s for s in await broker.stats() if s.queue == "group:email"]
    assert email.ready == 3 and email.lag >= 0  # unread events count as ready

    got = await fetch_all(broker, "group:email")
    assert sorted(d.message.headers["event_id"] for d in got if d.message) == sorted(
        e.id for e in events
    )
    groups = _groups(client, stream)
    # read into jobs in the same script: nothing left pending in the group
    assert (groups["group:email"]["lag"], groups["group:email"]["pending"]) == (0, 0)
    assert groups["group:billing"]["lag"] == 3
    for d in got:
        assert client.hget(f"{{dw:{prefix}}}:job:{d.id}", "st") == b"running"


async def _past_retention(broker: RedisBroker, since: float) -> None:
    """Let what happened at ``since`` (publishes, reads) age past the retention
    (time itself must pass: trimming compares publish and read times with
    the clock)."""
    await asyncio.sleep(max(0.0, since + broker.event_retention - time.time()) + 0.05)


async def test_trimming_keeps_what_a_reading_group_has_not_read(
    broker: RedisBroker, prefix: str, client: redis.Redis
) -> None:
    await _bind(broker, "group:fast", "group:slow")
    broker.event_retention = 1.0
    events = [event(n=i) for i in range(4)]
    await broker.publish(events)
    published_at = time.time()  # no later than any of their publish times
    await fetch_all(broker, "group:fast")
    assert len(await broker.fetch(["group:slow"], 1, 30.0, 0)) == 1
    stream = f"{{dw:{prefix}}}:ev:order.created"

    await _past_retention(broker, published_at)  # every event is past its retention
    # group:slow reads on (one more event): it is alive, and behind
    assert len(await broker.fetch(["group:slow"], 1, 30.0, 0)) == 1
    await broker.rescue()
    # it has read two: MINID keeps the last one it read and the two it has not
    assert client.xlen(stream) == 3
    page, _ = await broker.list_events("order.created")
    assert [m.id for m in page] == [e.id for e in events[1:]]

    assert len(await fetch_all(broker, "group:slow")) == 2
    await broker.rescue()
    # MINID keeps the last entry both groups read; everything before it goes
    assert client.xlen(stream) <= 1
    assert client.zcard(f"{{dw:{prefix}}}:evx") == 0


async def test_a_group_nobody_reads_does_not_hold_the_log_past_retention(
    broker: RedisBroker, prefix: str, client: redis.Redis
) -> None:
    """A subscriber group removed from the code (or whose workers have been
    gone for longer than the retention) keeps its consumer group, but not the
    log: retention wins over it.  A paused group's is kept (paused on
    purpose), until it is resumed and still nobody reads."""
    await _bind(broker, "group:gone", "group:held")
    await broker.pause("group:held")
    broker.event_retention = 1.0
    events = [event(n=i) for i in range(3)]
    await broker.publish(events)
    # group:gone's worker reads one, then goes away for good
    assert len(await broker.fetch(["group:gone"], 1, 30.0, 0)) == 1
    last_read = time.time()  # after the publish times and group:gone's read
    stream = f"{{dw:{prefix}}}:ev:order.created"

    await _past_retention(broker, last_read)
    await broker.rescue()
    assert client.xlen(stream) == 3  # group:held is paused: its place holds
    await broker.resume("group:held")
    await broker.rescue()
    assert client.xlen(stream) == 0
    assert set(_groups(client, stream)) == {"group:gone", "group:held"}  # groups stay
    # a worker that comes back reads what was published since
    later = event(n=9)
    await broker.publish([later])
    got = await fetch_all(broker, "group:gone")
    assert [d.message.headers["event_id"] for d in got if d.message] == [later.id]


async def test_the_same_event_twice_is_delivered_once_on_both_paths(
    broker: RedisBroker, prefix: str
) -> None:
    await _bind(broker, "group:g")
    e = event()
    assert broker.publish_sync([e]) == 1
    assert await broker.publish([e]) == 0
    assert broker.publish_sync([e, event()]) == 1
    assert len(await fetch_all(broker, "group:g")) == 2


async def test_an_idle_fetch_wakes_on_publish(broker: RedisBroker, prefix: str) -> None:
    await _bind(broker, "group:g")
    other = from_url(url(prefix))
    try:
        waiting = asyncio.create_task(other.fetch(["group:g"], 5, 30.0, 30.0, "w1"))
        r = redis.asyncio.Redis.from_url(SERVER)
        try:
            await eventually(lambda: r.zcard(f"{{dw:{prefix}}}:waiters:group:g"), bool)
        finally:
            await r.aclose()
        e = event()
        await broker.publish([e])
        [d] = await asyncio.wait_for(waiting, 10)
        assert d.message is not None and d.message.headers["event_id"] == e.id
    finally:
        await other.close()


async def test_a_group_moved_back_makes_no_second_delivery(
    broker: RedisBroker, prefix: str, client: redis.Redis
) -> None:
    await _bind(broker, "group:g")
    await broker.publish([event(), event()])
    first = await fetch_all(broker, "group:g")
    await broker.ack(first)
    client.xgroup_setid(f"{{dw:{prefix}}}:ev:order.created", "group:g", "0")
    assert await fetch_all(broker, "group:g") == []  # each event is one job per group
    assert client.zcard(f"{{dw:{prefix}}}:ids") == 2


async def test_a_deleted_stream_is_bound_again(
    broker: RedisBroker, prefix: str, client: redis.Redis
) -> None:
    await _bind(broker, "group:g")
    client.delete(f"{{dw:{prefix}}}:ev:order.created")
    e = event()
    assert await broker.publish([e]) == 1
    [d] = await fetch_all(broker, "group:g")
    assert d.message is not None and d.message.headers["event_id"] == e.id


async def test_events_with_an_eta_wait_for_it(broker: RedisBroker) -> None:
    await _bind(broker, "group:g")
    e = event()
    e.eta = time.time() + 3600
    await broker.publish([e])
    assert await broker.fetch(["group:g"], 10, 30.0, 0) == []
    [stats] = [s for s in await broker.stats() if s.queue == "group:g"]
    assert (stats.ready, stats.scheduled) == (0, 1)


async def test_a_binding_declared_later_starts_at_the_end_of_the_log(
    broker: RedisBroker,
) -> None:
    before = event()
    await broker.publish([before])
    await _bind(broker, "group:late")
    after = event()
    assert await broker.publish([after]) == 1
    got = await fetch_all(broker, "group:late")
    assert [d.message.headers["event_id"] for d in got if d.message] == [after.id]
    page, _ = await broker.list_events("order.created")
    assert [m.id for m in page] == [before.id, after.id]
    assert page[0] == before


async def test_the_log_and_each_groups_place_survive_a_restart(redis_server: RedisServer) -> None:
    broker = from_url(redis_server.url(prefix="app"))
    try:
        await _bind(broker, "group:a", "group:b")
        events = [event(n=i) for i in range(3)]
        await broker.publish(events)
        [first] = await broker.fetch(["group:a"], 1, 30.0, 0)
        await broker.ack([first])
        redis_server.stop()
        redis_server.start()  # same port and dir: the AOF brings everything back
        await broker.close()  # its pooled connections died with the server
        broker = from_url(redis_server.url(prefix="app"))
        rest = await fetch_all(broker, "group:a")
        every_b = await fetch_all(broker, "group:b")
        got_a = [d.message.headers["event_id"] for d in [first, *rest] if d.message]
        assert sorted(got_a) == sorted(e.id for e in events)  # each once
        assert len(every_b) == 3
        assert await broker.publish(events[:1]) == 0  # still known after the restart
        page, _ = await broker.list_events("order.created")
        assert [m.id for m in page] == [e.id for e in events]
    finally:
        await broker.close()


async def test_events_handed_to_a_dead_waiter_come_back_uncharged(
    broker: RedisBroker, prefix: str
) -> None:
    await _bind(broker, "group:g")
    dead = from_url(url(prefix))
    assert isinstance(dead, RedisBroker)
    try:
        # a worker registers as a waiter (what an idle fetch does first) and
        # is killed before it reads its inbox
        assert await dead.keyspace("group:g")._claim(
            ["group:g"], 10, 0.2, "w-dead", "w1", time.time() + 5
        ) == (
            [],
            None,
        )
        e = event()
        await broker.publish([e])  # handed to the waiter, leased to it
        [s] = [s for s in await broker.stats() if s.queue == "group:g"]
        assert (s.ready, s.running) == (0, 1)
        assert await eventually(broker.rescue, lambda n: n > 0) == 1
        [d] = await broker.fetch(["group:g"], 10, 30.0, 0, "w-new")
        assert d.message is not None and d.message.headers["event_id"] == e.id
        assert d.message.attempt == 1 and d.message.errors == []  # not charged
    finally:
        await dead.close()


async def test_an_idle_worker_of_several_groups_is_handed_each_groups_delivery(
    broker: RedisBroker, prefix: str
) -> None:
    await _bind(broker, "group:a", "group:b")
    other = from_url(url(prefix))
    try:
        waiting = asyncio.create_task(other.fetch(["group:a", "group:b"], 5, 30.0, 30.0, "w1"))
        r = redis.asyncio.Redis.from_url(SERVER)
        try:
            await eventually(lambda: r.zcard(f"{{dw:{prefix}}}:waiters:group:b"), bool)
        finally:
            await r.aclose()
        e = event()
        await broker.publish([e])
        got = await asyncio.wait_for(waiting, 10)  # one inbox item: both deliveries
        assert sorted(d.queue for d in got) == ["group:a", "group:b"]
        assert {d.message.headers["event_id"] for d in got if d.message} == {e.id}
    finally:
        await other.close()
