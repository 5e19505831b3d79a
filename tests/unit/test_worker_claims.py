"""A worker with two claims in flight (``Capabilities.concurrent_fetches``,
which Redis sets), over the memory broker told to allow two: each fetch
waits a millisecond before it claims, as a round trip to a server does,
and jobs end meanwhile, so the other claim loop sends its own."""

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


async def test_two_claims_in_flight_never_hold_more_than_one_claim_would() -> None:
    """The loops share one bound: what the worker holds (fetched, not yet
    started) plus what its fetches under way ask for never passes the most
    a worker may hold (its slots and the prefetch's cap); two loops that
    each claimed the room they saw would ask for it twice.  Every job still
    runs once."""
    app = dw.App("memory://")
    _two_claims(app)
    concurrency = 32
    most = concurrency * (1 + PREFETCH_SLOTS)
    n = 3000
    ran: list[int] = []

    @app.task
    async def step(i: int) -> None:
        ran.append(i)
        await asyncio.sleep(0.001)  # a job's work: slots stay busy while claims are out
        if len(ran) == n:
            done.set()

    done = asyncio.Event()
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
        # fetched but not started, plus what every fetch under way may bring
        worst = max(worst, delivered - len(ran) + sum(asking))
        try:
            await asyncio.sleep(0.001)  # the round trip: the other loop runs meanwhile
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
