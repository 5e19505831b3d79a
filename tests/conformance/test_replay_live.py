"""Replaying dead letters while workers run: every replayed job runs to success.

A replay must never make a job visible to a worker before the job's stored
state says it is live again: a worker that took such a copy while the
record still said ``dead`` would drop it as finished, and the job would stay
``ready`` with nothing left to run it (RabbitMQ did, issue 18).  Many jobs
and two workers already running, so a wrong order has many chances to show.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter, QueueStats
from dumbwaiter.state import State

from .helpers import eventually

N = 60


def _count(stats: list[QueueStats], state: str) -> int:
    return sum(int(getattr(s, state)) for s in stats if s.queue == "default")


async def test_every_replayed_job_runs_to_success_with_workers_running(
    make_app: Callable[..., dw.App],
) -> None:
    app = make_app(retry=dw.Retry.never())
    gateway_up = False
    ran: set[str] = set()
    all_ran = asyncio.Event()

    @app.task
    async def charge(n: int, ctx: dw.Context) -> None:
        if not gateway_up:
            raise ConnectionError("the payment gateway is down")
        ran.add(ctx.job_id)
        if len(ran) == N:
            all_ran.set()

    ids = {(await charge.aenqueue(n)).id for n in range(N)}
    workers = [dw.Worker(app, concurrency=8) for _ in range(2)]
    runs = [asyncio.create_task(w.run()) for w in workers]
    try:
        await eventually(app.broker.stats, lambda s: _count(s, "dead") == N, timeout=60)
        gateway_up = True
        assert await app.broker.replay(JobFilter(state=State.DEAD)) == N
        try:
            await asyncio.wait_for(all_ran.wait(), 60)
        except TimeoutError:
            states = {i: (await app.broker.get(i)) for i in ids - ran}
            raise AssertionError(
                f"{len(ran)} of {N} replayed jobs ran; the others: "
                f"{sorted({str(info.state) if info else 'gone' for info in states.values()})}"
            ) from None
        assert ran == ids
        await eventually(app.broker.stats, lambda s: _count(s, "succeeded") == N, timeout=30)
        # at rest: a twin copy of a replayed job (NATS) may still be on its
        # way to a worker that drops it, counted ready until it is dropped
        await eventually(
            app.broker.stats,
            lambda s: _count(s, "dead") == _count(s, "ready") == _count(s, "running") == 0,
            timeout=20,
        )
        for i in ids:
            info = await app.broker.get(i)
            assert info is not None and info.state is State.SUCCEEDED and info.replays == 1
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*runs)
