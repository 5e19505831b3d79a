"""A worker with two claims in flight (``Capabilities.concurrent_fetches``,
which Redis sets), over the memory broker told to allow two: each fetch
made while the worker holds jobs waits, as a round trip to a server does,
until one of them has run, so the other claim loop sends its own."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import dumbwaiter as dw
from dumbwaiter.brokers.types import Delivery
from dumbwaiter.worker import PREFETCH_SLOTS


def _two_claims(app: dw.App) -> None:
    broker = app.broker
    broker.capabilities = dataclasses.replace(  # type: ignore[misc]
        type(broker).capabilities, concurrent_fetches=2
    )


async def test_a_second_claim_leaves_while_the_first_is_out_within_one_bound() -> None:
    """With two claims allowed, the worker sends a second claim while the
    first is still on its way (the point of the pipeline), yet what it holds
    (running or fetched, not yet started) plus what its fetches under way
    ask for never passes the most a worker may hold (its slots and the
    prefetch's cap).  Every job runs once."""
    app = dw.App("memory://")
    _two_claims(app)
    concurrency = 32
    most = concurrency * (1 + PREFETCH_SLOTS)
    n = 3000
    ran: list[int] = []

    @app.task
    async def step(i: int) -> None:
        ran.append(i)
        ended.set()
        if len(ran) == n:
            done.set()

    done = asyncio.Event()
    ended = asyncio.Event()  # a job ran
    await step.aenqueue_many([(i,) for i in range(n)])
    real = app.broker.fetch
    asking: list[int] = []  # the limits of the fetches under way
    delivered = 0
    overlaps = 0
    worst = 0

    async def fetch(
        queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        nonlocal delivered, overlaps, worst
        overlaps += bool(asking)
        asking.append(limit)
        # what the worker holds, plus what every fetch under way may bring
        worst = max(worst, len(w._inflight) + len(w._buffer) + sum(asking))
        try:
            if delivered > len(ran):
                # the round trip: its reply comes once a held job has run, so
                # the other loop may claim the room that job left meanwhile
                ended.clear()
                await ended.wait()
            out = await real(queues, limit, lease, wait, worker)
        finally:
            asking.remove(limit)
        delivered += len(out)
        return out

    app.broker.fetch = fetch  # type: ignore[method-assign]
    w = dw.Worker(app, concurrency=concurrency, fetch_wait=0.05)
    run = asyncio.create_task(w.run())
    await asyncio.wait_for(done.wait(), 30)
    w.stop()
    await asyncio.wait_for(run, 30)
    assert sorted(ran) == list(range(n))
    assert overlaps > 0  # the second loop did claim while the first's fetch was out
    assert worst <= most
