"""Priorities, eta and delays."""

from __future__ import annotations

import asyncio
import time

from dumbwaiter.brokers.base import Broker
from dumbwaiter.state import State

from .conftest import msg
from .helpers import fetch_all


async def test_higher_priority_runs_first(broker: Broker) -> None:
    low, high, mid, low2 = msg(priority=0), msg(priority=10), msg(priority=5), msg(priority=0)
    for m in (low, high, mid, low2):
        await broker.enqueue([m])
    order = [d.id for d in await fetch_all(broker)]
    assert order == [high.id, mid.id, low.id, low2.id]
    # one at a time too
    for m in (low, high, mid):
        m2 = msg(priority=m.priority, args=[m.priority])
        await broker.enqueue([m2])
    got = []
    while ds := await broker.fetch(["default"], 1, 30.0, 0):
        got.append(ds[0].message.args[0])  # type: ignore[union-attr]
    assert got == [10, 5, 0]


async def test_negative_priority_runs_last(broker: Broker) -> None:
    late, normal = msg(priority=-5), msg()
    await broker.enqueue([late, normal])
    assert [d.id for d in await fetch_all(broker)] == [normal.id, late.id]


async def test_eta_in_the_future_is_scheduled_until_due(broker: Broker) -> None:
    # far enough ahead that a loaded machine's enqueue, get and stats all
    # happen before it comes due (0.4 s was not, under a full CI run)
    # the fetcher is in its consumer group (Kafka: a join takes a second or
    # more) before the eta's clock starts, so only this test's steps race it
    assert await fetch_all(broker) == []
    due = time.time() + 2.0
    later, now_ = msg(eta=due), msg()
    await broker.enqueue([later, now_])
    info = await broker.get(later.id)
    assert info is not None and info.state is State.SCHEDULED
    [stats] = await broker.stats()
    assert (stats.ready, stats.scheduled) == (1, 1)
    assert [d.id for d in await fetch_all(broker)] == [now_.id]
    # a waiting fetch returns it when it comes due, without another enqueue
    [d] = await asyncio.wait_for(broker.fetch(["default"], 1, 30.0, 30.0), 10)
    assert d.id == later.id and time.time() >= due


async def test_eta_in_the_past_is_ready_at_once(broker: Broker) -> None:
    m = msg(eta=time.time() - 10)
    await broker.enqueue([m])
    assert [d.id for d in await broker.fetch(["default"], 1, 30.0, 0)] == [m.id]
