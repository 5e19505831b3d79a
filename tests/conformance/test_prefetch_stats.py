"""Stats tell the jobs a handler runs from the ones a worker only holds.

A worker leases more jobs than it has slots when its jobs are short (its
prefetch, up to twice its concurrency), and the broker sees every leased job
the same way: ``stats`` showed 62-66 "running" for one worker at ``-c 32``.
The worker announces its buffered jobs per queue with its heartbeat, and
``queue_stats`` (the CLI, the dashboard, the gauges) splits the leased jobs
into ``running`` and ``prefetched``.  On every broker, because each counts
the leases its own way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

import dumbwaiter as dw
from dumbwaiter import worker as worker_module
from dumbwaiter.brokers.types import QueueStats
from dumbwaiter.metrics import queue_stats


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30.0) -> None:
    """Poll ``check`` (the worker runs on this loop: an async poll) until true."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_worker_shows_its_slots_running_and_its_buffer_prefetched(
    make_app: Callable[..., dw.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the prefetch is sized by how long the jobs took (worker._prefetch): on
    # a loaded machine even a no-op measures long enough to hold fewer than
    # the cap, so a long horizon makes the cap (twice the concurrency) the
    # size whatever the machine's load
    monkeypatch.setattr(worker_module, "PREFETCH_HORIZON", 60.0)
    app = make_app()
    gate = asyncio.Event()
    quick_done: list[int] = []

    @app.task(queue="slow")
    async def quick(n: int) -> None:
        quick_done.append(n)

    @app.task(queue="slow")
    async def slow(n: int) -> None:
        await gate.wait()

    worker = dw.Worker(app, concurrency=2, heartbeat=0.1, lease=10.0, fetch_wait=0.05)
    run = asyncio.create_task(worker.run())
    try:
        # short jobs first: the worker learns they are short and prefetches
        await quick.aenqueue_many(range(20))

        async def quick_ones_done() -> bool:
            return len(quick_done) == 20

        await _until(quick_ones_done, "the short jobs")
        await slow.aenqueue_many(range(10))
        # 2 in its slots; 4 (twice its concurrency) in its buffer; 4 ready
        last: list[QueueStats] = []

        async def split_seen() -> bool:
            stats, _ = await queue_stats(app.broker)
            last[:] = [s for s in stats if s.queue == "slow"]
            return bool(last) and last[0].prefetched == 4

        await _until(split_seen, "4 prefetched jobs in the stats")
        [s] = last
        assert (s.running, s.prefetched, s.ready) == (2, 4, 4), s
        [raw] = [s for s in await app.broker.stats() if s.queue == "slow"]
        assert raw.running == 6  # the broker alone sees 6 leased jobs
        assert s.to_dict()["prefetched"] == 4
    finally:
        gate.set()
        worker.stop()
        await run
