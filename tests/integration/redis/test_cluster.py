"""A Redis Cluster: the broker follows MOVED to the node that owns its slot."""

from __future__ import annotations

import asyncio

import redis
from redis.crc import key_slot

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.types import Binding
from tests.conformance.conftest import msg
from tests.conformance.helpers import fetch_all, until_fetch_waits
from tests.conformance.test_events import event

from .conftest import RedisCluster


def _owner(cluster: RedisCluster, prefix: str) -> int:
    """The port of the node that serves the prefix's slot."""
    slot = key_slot(f"{{dw:{prefix}}}".encode())
    client = redis.Redis(port=cluster.nodes[0].port)
    try:
        for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call]
            if start <= slot <= end:
                return int(primary[1])
    finally:
        client.close()
    raise AssertionError(f"no node serves slot {slot}")


def _elsewhere(cluster: RedisCluster) -> tuple[str, int]:
    """A prefix whose slot is not served by the first node, and its owner."""
    for i in range(100):
        owner = _owner(cluster, f"app{i}")
        if owner != cluster.nodes[0].port:
            return f"app{i}", owner
    raise AssertionError("every prefix hashed to the first node")


async def test_broker_follows_moved_to_its_slot(redis_cluster: RedisCluster) -> None:
    prefix, owner = _elsewhere(redis_cluster)
    url = redis_cluster.nodes[0].url(prefix=prefix)  # the wrong node on purpose
    consumer, producer = from_url(url), from_url(url)
    try:
        waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 10.0, "w"))
        await until_fetch_waits(consumer)  # registered on the slot's owner
        m = msg()
        assert await producer.enqueue([m]) == [m.id]
        [d] = await asyncio.wait_for(waiting, 10)  # handed over through the inbox
        assert d.id == m.id
        await consumer.ack([d])
        ids = await producer.enqueue([msg() for _ in range(2500)])  # staged bulk
        assert len(await fetch_all(consumer)) == len(ids) == 2500
        assert await producer.kv_incr("n") == 1
        # kv_update's compare-and-set is one script on the app's slot too
        bump = lambda got: ({"n": b"%d" % (int(got["n"]) + 1), "m": b"1"}, None)  # noqa: E731
        await producer.kv_update(["n", "m"], bump)
        assert await consumer.kv_get(["n", "m"]) == {"n": b"2", "m": b"1"}
        assert await producer.acquire("leader", "me", 30.0) is not None
        [stats] = await producer.stats()
        assert (stats.succeeded, stats.running) == (1, 2500)
        # events: the streams and their consumer groups live in the same slot
        await producer.declare(["group:g"], [Binding("order.created", "group:g")])
        assert await producer.publish([event(), event()]) == 2
        assert producer.publish_sync([event()]) == 1
        assert len(await fetch_all(consumer, "group:g")) == 3
        page, _ = await consumer.list_events("order.created")
        assert len(page) == 3
    finally:
        await consumer.close()
        await producer.close()
    client = redis.Redis(port=owner)
    try:
        assert client.exists(f"{{dw:{prefix}}}:ids")
    finally:
        client.close()


def test_sync_producer_follows_moved(redis_cluster: RedisCluster) -> None:
    prefix, _ = _elsewhere(redis_cluster)
    app = dw.App(redis_cluster.nodes[0].url(prefix=prefix))
    task = app.task(name="t.job")(lambda i: None)
    try:
        job = task.enqueue(1)
        assert len(task.enqueue_many(range(1500))) == 1500
        assert job.status() == "ready"
    finally:
        app.close()


def _spread(cluster: RedisCluster, prefix: str) -> dict[str, int]:
    """Three queue names whose keyspaces hash to three different primaries."""
    out: dict[str, int] = {}
    owners: set[int] = set()
    for i in range(200):
        q = f"q{i}"
        owner = _owner(cluster, f"{prefix}/q:{q}")
        if owner not in owners:
            owners.add(owner)
            out[q] = owner
        if len(out) == 3:
            return out
    raise AssertionError("no three queues on three primaries")


async def test_a_tag_per_queue_spreads_one_app_over_the_primaries(
    redis_cluster: RedisCluster,
) -> None:
    """``layout=queues``: each queue's jobs live on the primary that owns its
    slot, and one worker on the three queues drains them all."""
    prefix = "spread"
    queues = _spread(redis_cluster, prefix)
    url = redis_cluster.nodes[0].url(prefix=prefix, layout="queues")
    consumer, producer = from_url(url), from_url(url)
    try:
        ids = await producer.enqueue([msg(queue=q) for q in queues for _ in range(300)])
        got: list[str] = []
        while len(got) < len(ids):
            ds = await consumer.fetch(list(queues), 200, 30.0, 1.0, "w")
            await consumer.ack(ds)
            got += [d.id for d in ds]
        assert sorted(got) == sorted(ids)
        rows = {s.queue: s.succeeded for s in await producer.stats()}
        assert rows == dict.fromkeys(queues, 300)
    finally:
        await consumer.close()
        await producer.close()
    for q, owner in queues.items():
        client = redis.Redis(port=owner)
        try:
            assert client.exists(f"{{dw:{prefix}/q:{q}}}:fin")  # compact records
        finally:
            client.close()
