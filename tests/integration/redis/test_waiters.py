"""Idle workers: jobs handed to a waiter that died are given back uncharged."""

from __future__ import annotations

import time

from dumbwaiter.brokers import from_url
from dumbwaiter.brokers.redis import RedisBroker
from dumbwaiter.state import State
from tests.conformance.conftest import msg
from tests.conformance.helpers import eventually


async def test_job_handed_to_a_dead_waiter_comes_back_uncharged(shared_url: str) -> None:
    dead, alive = from_url(shared_url), from_url(shared_url)
    assert isinstance(dead, RedisBroker)
    try:
        # a worker registers as a waiter (what an idle fetch does first) and
        # is killed before it reads its inbox
        assert await dead.keyspace("default")._claim(
            ["default"], 10, 0.2, "w-dead", "w1", time.time() + 5
        ) == (
            [],
            None,
        )
        m = msg()
        await alive.enqueue([m])
        info = await alive.get(m.id)
        assert info is not None and info.state is State.RUNNING and info.worker == "w-dead"
        assert await eventually(alive.rescue, lambda n: n > 0) == 1
        [d] = await alive.fetch(["default"], 10, 30.0, 0, "w-new")
        assert d.id == m.id
        assert d.message is not None and d.message.attempt == 1  # not charged
        assert d.message.errors == []
    finally:
        await dead.close()
        await alive.close()


async def test_lapsed_waiter_is_skipped(shared_url: str) -> None:
    gone, producer = from_url(shared_url), from_url(shared_url)
    assert isinstance(gone, RedisBroker)
    try:
        # registered until a moment already past (as a waiter that died a while ago)
        await gone.keyspace("default")._claim(
            ["default"], 10, 30.0, "w-gone", "w2", time.time() - 0.01
        )
        m = msg()
        await producer.enqueue([m])
        info = await producer.get(m.id)
        assert info is not None and info.state is State.READY
    finally:
        await gone.close()
        await producer.close()


async def test_paused_queue_keeps_its_waiter(shared_url: str) -> None:
    """A waiter registered before its queue was paused is handed nothing
    (one job or a batch) and stays registered: the resume wakes it."""
    waiter, producer = from_url(shared_url), from_url(shared_url)
    assert isinstance(waiter, RedisBroker) and isinstance(producer, RedisBroker)
    try:
        await waiter.keyspace("default")._claim(
            ["default"], 10, 30.0, "w-idle", "w3", time.time() + 5
        )
        await producer.pause("default")
        one, batch = msg(), [msg(), msg()]
        await producer.enqueue([one])
        await producer.enqueue(batch)
        for m in (one, *batch):
            info = await producer.get(m.id)
            assert info is not None and info.state is State.READY
        await producer.resume("default")
        inbox = producer.conn.keys.inbox("w3")
        assert await producer.conn.links.get().call(b"LRANGE", inbox, 0, -1) == [b"w"]
    finally:
        await waiter.close()
        await producer.close()
