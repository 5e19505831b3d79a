"""Cancelling a running job: the broker's ``cancel_running`` and the request a
worker reads from the shared kv store at its heartbeat."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import dumbwaiter as dw
from dumbwaiter.brokers.base import Broker
from dumbwaiter.cancel import CANCEL_PREFIX, request_cancel
from dumbwaiter.state import State

from .conftest import msg


async def test_cancel_running_ends_a_held_job_cancelled(broker: Broker) -> None:
    held, other = msg(), msg()
    await broker.enqueue([held])
    [d] = await broker.fetch(["default"], 1, 30.0, 0)
    await broker.enqueue([other])
    assert await broker.cancel_running([d]) == [held.id]
    info = await broker.get(held.id)
    assert info is not None and info.state is State.CANCELLED
    # it is never handed out again; the other job is untouched
    got = await broker.fetch(["default"], 10, 30.0, 0)
    assert [g.id for g in got] == [other.id]
    [row] = [s for s in await broker.stats() if s.queue == "default"]
    assert (row.running, row.cancelled, row.ready) == (1, 1, 0)
    await broker.ack(got)


async def test_a_running_handler_sees_the_request_and_the_job_ends_cancelled(
    make_app: Callable[..., dw.App],
) -> None:
    """The request is written by another App (another process's view) into
    the broker's kv; the worker reads it at its heartbeat."""
    app, admin = make_app(), make_app()
    started = asyncio.Event()
    seen: list[bool] = []

    @app.task(retry=dw.Retry(attempts=3, backoff=0))
    async def crunch(n: int, ctx: dw.Context) -> None:
        started.set()
        for _ in range(6000):  # a minute of work in steps, checking between them
            if ctx.cancelled:
                seen.append(True)
            ctx.raise_if_cancelled()
            await asyncio.sleep(0.01)

    job = await crunch.aenqueue(1)
    w = dw.Worker(app, heartbeat=0.1, lease=5.0, fetch_wait=0.1)
    run = asyncio.create_task(w.run())
    try:
        await asyncio.wait_for(started.wait(), 30)
        assert await request_cancel(admin.broker, [job.id], "test") == {job.id: "requested"}
        deadline = time.monotonic() + 30
        while (await job.astatus()) is not State.CANCELLED:
            assert time.monotonic() < deadline, "the job never ended cancelled"
            await asyncio.sleep(0.02)
    finally:
        w.stop()
        await asyncio.wait_for(run, 30)
    assert seen == [True]
    assert w.counts["cancelled"] == 1 and w.counts["retried"] == 0 and w.counts["dead"] == 0
    assert await admin.broker.kv_scan(CANCEL_PREFIX) == {}  # the request is gone
    info = await admin.broker.get(job.id)
    assert info is not None and info.message.errors == []  # not a failure
