"""Coordination: leases on names with fencing tokens (scheduler leader, locks)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dumbwaiter.brokers.base import Broker

from .helpers import eventually


async def test_one_owner_at_a_time(broker: Broker) -> None:
    t1 = await broker.acquire("leader", "a", 30.0)
    assert t1 is not None
    assert await broker.acquire("leader", "b", 30.0) is None
    assert await broker.acquire("leader", "a", 30.0) == t1  # re-acquire keeps the token
    assert await broker.renew("leader", "a", t1, 30.0)
    assert not await broker.renew("leader", "b", t1, 30.0)
    await broker.release("leader", "a", t1)
    t2 = await broker.acquire("leader", "b", 30.0)
    assert t2 is not None and t2 > t1


async def test_expired_lock_passes_to_another_owner(broker: Broker) -> None:
    t1 = await broker.acquire("leader", "a", 0.2)
    assert t1 is not None
    t2 = await eventually(lambda: broker.acquire("leader", "b", 30.0), lambda t: t is not None)
    assert t2 is not None and t2 > t1
    assert not await broker.renew("leader", "a", t1, 30.0)  # the old owner is fenced off
    await broker.release("leader", "a", t1)  # a stale release changes nothing
    assert await broker.acquire("leader", "c", 30.0) is None


async def test_names_are_independent(broker: Broker) -> None:
    assert await broker.acquire("x", "a", 30.0) is not None
    assert await broker.acquire("y", "b", 30.0) is not None


async def test_concurrent_acquire_has_one_winner(make_broker: Callable[[], Broker]) -> None:
    brokers = [make_broker() for _ in range(5)]
    for b in brokers:
        await b.open()
    tokens = await asyncio.gather(
        *(b.acquire("leader", f"owner-{i}", 30.0) for i, b in enumerate(brokers))
    )
    assert sum(t is not None for t in tokens) == 1
