"""``layout=queues``: each queue's keys under a hash tag of its own, so a
Redis Cluster spreads an app's queues over its primaries (``layout.py``).

What a user relies on: jobs of each queue live under that queue's tag; a
worker on several queues gets work from any of them, also while it waits;
the calls that do not name a queue (``get``, ``cancel``, ``stats``, a
listing) see every queue; an app written with one layout refuses a process
configured with the other instead of splitting silently.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.errors import BrokerConfigError
from tests.conformance.conftest import msg
from tests.conformance.helpers import until_fetch_waits
from tests.integration.redis.server import SERVER, new_prefix, url


def _queues_url(prefix: str) -> str:
    return url(prefix, layout="queues")


def _raw() -> redis.Redis:
    return redis.Redis.from_url(SERVER)


async def test_each_queue_keeps_its_jobs_under_its_own_tag() -> None:
    prefix = new_prefix()
    b: Any = from_url(_queues_url(prefix))
    try:
        a, c = msg(queue="a"), msg(queue="c")
        assert await b.enqueue([a, c]) == [a.id, c.id]
        raw = _raw()
        try:
            assert raw.exists(f"{{dw:{prefix}/q:a}}:job:{a.id}")
            assert raw.exists(f"{{dw:{prefix}/q:c}}:job:{c.id}")
            assert not raw.exists(f"{{dw:{prefix}}}:job:{a.id}")
            assert raw.get(f"{{dw:{prefix}}}:layout") == b"queues"
        finally:
            raw.close()
        assert {s.queue: s.ready for s in await b.stats()} == {"a": 1, "c": 1}
    finally:
        await b.close()


async def test_a_worker_on_several_queues_waiting_gets_a_job_of_any() -> None:
    prefix = new_prefix()
    consumer: Any = from_url(_queues_url(prefix))
    producer = from_url(_queues_url(prefix))
    try:
        waiting = asyncio.create_task(consumer.fetch(["a", "b", "c"], 10, 30.0, 10.0, "w"))
        for q in ("a", "b", "c"):
            await until_fetch_waits(consumer, q)
        m = msg(queue="b")
        await producer.enqueue([m])
        [d] = await asyncio.wait_for(waiting, 10)
        assert (d.id, d.queue) == (m.id, "b")
        await consumer.ack([d])
        for q in ("a", "c"):  # the other waits ended, withdrawn (woken, not cut)
            conn = consumer.keyspace(q).conn
            assert await conn.links.get().call(b"ZCARD", conn.keys.waiters(q)) == 0
        # the waits on the other queues ended: a job enqueued there now is
        # ready for the next fetch, not handed to a waiter that is gone
        later = msg(queue="c")
        await producer.enqueue([later])
        [d2] = await consumer.fetch(["a", "b", "c"], 10, 30.0, 0, "w")
        assert d2.id == later.id and d2.message is not None and d2.message.attempt == 1
    finally:
        await consumer.close()
        await producer.close()


async def test_calls_without_a_queue_see_every_queue() -> None:
    b = from_url(_queues_url(new_prefix()))
    try:
        ms = [msg(queue=q) for q in ("a", "b", "c", "a", "b")]
        assert await b.enqueue(ms) == [m.id for m in ms]
        info = await b.get(ms[1].id)
        assert info is not None and info.message.queue == "b"
        assert await b.cancel([ms[0].id, ms[2].id, "nope"]) == [ms[0].id, ms[2].id]
        seen: list[str] = []
        cursor = None
        while True:  # pages of 2 across three keyspaces
            page = await b.list_jobs(JobFilter(), cursor, 2)
            seen += [i.message.id for i in page.items]
            cursor = page.cursor
            if cursor is None:
                break
        assert sorted(seen) == sorted(m.id for m in ms)
        rows = {s.queue: (s.ready, s.cancelled) for s in await b.stats()}
        assert rows == {"a": (1, 1), "b": (2, 0), "c": (0, 1)}
    finally:
        await b.close()


async def test_a_unique_key_blocks_within_its_queue_only() -> None:
    """The documented cost of the layout: unique keys are per queue."""
    b = from_url(_queues_url(new_prefix()))
    try:
        one, same, other = msg(queue="a", key="k"), msg(queue="a", key="k"), msg(queue="b", key="k")
        assert await b.enqueue([one, same, other]) == [one.id, one.id, other.id]
    finally:
        await b.close()


@pytest.mark.parametrize(("first", "second"), [("app", "queues"), ("queues", "app")])
async def test_another_layout_refuses_to_start_on_an_app(first: str, second: str) -> None:
    prefix = new_prefix()
    writer, other = from_url(url(prefix, layout=first)), from_url(url(prefix, layout=second))
    try:
        await writer.enqueue([msg()])
        with pytest.raises(BrokerConfigError, match=f"layout={first}.*layout={second}"):
            await other.enqueue([msg()])
        with pytest.raises(BrokerConfigError, match=f"layout={first}"):
            other.enqueue_sync([msg()])
    finally:
        await writer.close()
        await other.close()


async def test_keys_written_before_the_layout_record_count_as_one_tag() -> None:
    """An app stored by a version without the record (one tag) is not taken
    for empty by a process with a tag per queue."""
    prefix = new_prefix()
    old = from_url(url(prefix))
    try:
        await old.enqueue([msg()])
    finally:
        await old.close()
    raw = _raw()
    try:
        raw.delete(f"{{dw:{prefix}}}:layout")  # as an older version left it
    finally:
        raw.close()
    b = from_url(_queues_url(prefix))
    try:
        with pytest.raises(BrokerConfigError, match="layout=app"):
            await b.fetch(["default"], 1, 30.0, 0)
    finally:
        await b.close()
