"""Unique keys and duplicate ids: stored once, the first job's id returned."""

from __future__ import annotations

from dumbwaiter.brokers.base import Broker

from .conftest import msg
from .helpers import fetch_all


async def test_same_key_is_stored_once(broker: Broker) -> None:
    a, b = msg(key="welcome:42"), msg(key="welcome:42")
    assert await broker.enqueue([a]) == [a.id]
    assert await broker.enqueue([b]) == [a.id]
    assert len(await fetch_all(broker)) == 1


async def test_same_key_within_one_batch(broker: Broker) -> None:
    a, b, c = msg(key="k"), msg(key="k"), msg(key="other")
    ids = await broker.enqueue([a, b, c])
    assert ids == [a.id, a.id, c.id]
    assert len(await fetch_all(broker)) == 2


async def test_key_holds_after_the_job_ran(broker: Broker) -> None:
    """A periodic tick key must not run twice even after the first run finished."""
    a = msg(key="periodic:report:1700000000")
    await broker.enqueue([a])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.ack([d])
    b = msg(key="periodic:report:1700000000")
    assert await broker.enqueue([b]) == [a.id]
    assert await broker.fetch(["default"], 1, 30.0, 0) == []


async def test_duplicate_id_is_stored_once(broker: Broker) -> None:
    a = msg()
    assert await broker.enqueue([a]) == [a.id]
    assert await broker.enqueue([a]) == [a.id]
    assert len(await fetch_all(broker)) == 1


async def test_keys_do_not_collide_with_unkeyed_jobs(broker: Broker) -> None:
    ms = [msg() for _ in range(3)] + [msg(key="x")]
    assert await broker.enqueue(ms) == [m.id for m in ms]
    assert len(await fetch_all(broker)) == 4
