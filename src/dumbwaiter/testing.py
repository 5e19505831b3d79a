"""Helpers for testing code that uses dumbwaiter (and for dumbwaiter's own tests).

``await drain(app)`` runs a real worker until the queues are empty and
returns it (its ``counts`` say what happened), so a test waits on the queue
draining instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from .app import App
from .worker import Worker, WorkerConfig


async def drain(
    app: App,
    queues: Sequence[str] | None = None,
    *,
    scheduled: bool = True,
    timeout: float = 30.0,
    **config: Any,
) -> Worker:
    """Run a worker on ``queues`` (default: every queue of the app's tasks and
    groups) until nothing is ready or running there (and,
    with ``scheduled``, nothing is waiting for its eta or retry either).

    Raises ``TimeoutError`` if that does not happen within ``timeout`` s.
    """
    config.setdefault("concurrency", 8)
    config.setdefault("fetch_wait", 0.1)
    worker = Worker(app, WorkerConfig(queues=tuple(queues or ()), **config))
    queues = worker.queues
    run = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    try:
        while True:
            if run.done():
                await run  # the worker crashed: raise its error
                raise RuntimeError("worker stopped before the queues drained")
            if worker.inflight == 0 and await _empty(app, queues, scheduled):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"queues {list(queues)} did not drain in {timeout} s")
            await asyncio.sleep(0.01)
    finally:
        worker.stop()
        await run
    return worker


async def _empty(app: App, queues: Sequence[str], scheduled: bool) -> bool:
    for s in await app.broker.stats():
        if s.queue not in queues:
            continue
        if s.ready or s.running or (scheduled and (s.scheduled or s.retrying)):
            return False
    return True
