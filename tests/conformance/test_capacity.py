"""Bounded queues at the seam: ``enqueue_bounded`` admits no more than
``max_ready`` waiting jobs, under racing producers, on every broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.capacity import waiting
from dumbwaiter.errors import BrokerError, QueueFull

from .conftest import msg
from .helpers import eventually

LIMIT = 5


async def _waiting(broker: Broker, queue: str = "default") -> int:
    return sum(waiting(s) for s in await broker.stats() if s.queue == queue)


async def test_a_full_queue_refuses_the_whole_batch_and_names_itself(broker: Broker) -> None:
    bound = {"default": 3}
    await broker.enqueue_bounded([msg(), msg(eta=time.time() + 3600)], bound)  # scheduled counts
    with pytest.raises(QueueFull) as raised:
        await broker.enqueue_bounded([msg(), msg()], bound)
    full = raised.value
    assert isinstance(full, BrokerError)  # code handling broker errors handles it too
    assert (full.queue, full.limit, full.waiting, full.asked) == ("default", 3, 2, 2)
    assert "'default'" in str(full) and "max_ready=3" in str(full)
    assert await _waiting(broker) == 2  # nothing of the refused batch was stored
    await broker.enqueue_bounded([msg(), msg(queue="other"), msg(queue="other")], bound)
    assert await _waiting(broker) == 3
    with pytest.raises(QueueFull):
        await broker.enqueue_bounded([msg()], bound)
    await broker.enqueue_bounded([msg(queue="other")], bound)  # an unbounded queue takes more


async def test_a_fetched_job_makes_room(broker: Broker) -> None:
    bound = {"default": 2}
    await broker.enqueue_bounded([msg(), msg()], bound)
    with pytest.raises(QueueFull):
        await broker.enqueue_bounded([msg()], bound)
    got = await broker.fetch(["default"], 1, lease=30, wait=5)
    assert len(got) == 1
    await broker.enqueue_bounded([msg()], bound)  # running jobs are the workers' already
    await broker.ack(got)
    with pytest.raises(QueueFull):
        await broker.enqueue_bounded([msg()], bound)


async def test_racing_producers_never_pass_the_bound(make_broker: Callable[[], Broker]) -> None:
    """Six producers (each its own connection, like six processes) race to
    fill the queue while a slow worker takes a job now and then: each
    admission is counted, and no count of waiting jobs ever passes the
    bound; in the end, admitted = bound + taken by the worker, exactly."""
    producers = [make_broker() for _ in range(6)]
    worker = make_broker()
    for b in (*producers, worker):
        await b.open()
    bound = {"default": LIMIT}
    admitted = 0
    refused = 0
    taken = 0
    stop = asyncio.Event()

    async def produce(b: Broker) -> None:
        nonlocal admitted, refused
        while not stop.is_set():
            try:
                await b.enqueue_bounded([msg()], bound)
                admitted += 1
            except QueueFull:
                refused += 1
                await asyncio.sleep(0.005)

    async def work() -> None:
        nonlocal taken

        async def full() -> None:  # let the producers fill it (again)
            await eventually(lambda: _waiting(worker), lambda n: n >= LIMIT, timeout=60)

        for _ in range(4):
            await full()
            got = await worker.fetch(["default"], 1, lease=30, wait=5)
            await worker.ack(got)
            taken += len(got)
        await full()
        stop.set()

    seen: list[int] = []

    async def watch() -> None:
        while not stop.is_set():
            seen.append(await _waiting(worker))
            await asyncio.sleep(0.002)  # a sample, not a wait: let the others run

    await asyncio.wait_for(asyncio.gather(*(produce(b) for b in producers), work(), watch()), 120)
    assert taken == 4 and refused > 0
    assert max(seen) <= LIMIT
    assert admitted == LIMIT + taken
    assert await _waiting(worker) == LIMIT
