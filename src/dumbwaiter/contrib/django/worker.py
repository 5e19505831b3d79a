"""Run the jobs of a ``DumbwaiterBackend``: a worker, and the outbox relay of
Django's database, in one process (``manage.py dumbwaiter_worker``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence

from django.db import connections

from ...relay import Relay
from ...relay import service as relay_service
from ...testing import drain as drain_queues
from ...worker import Service, Worker, WorkerConfig
from .backend import DumbwaiterBackend

log = logging.getLogger("dumbwaiter.django")

_PENDING = "SELECT count(*) FROM dw_outbox WHERE relayed_at IS NULL"


async def serve(
    backend: DumbwaiterBackend,
    *,
    queues: Sequence[str],
    concurrency: int = 32,
    lease: float = 15.0,
    grace: float = 25.0,
    relay_url: str | None = None,
    with_scheduler: bool = False,
) -> Worker:
    """Work until SIGTERM or SIGINT (a second one gives running jobs back at
    once), relaying ``relay_url``'s outbox alongside."""
    app = backend.app
    services: list[Service] = []
    if relay_url:
        services.append(relay_service(relay_url))
    if with_scheduler:
        from ...scheduler import Scheduler

        services.append(Scheduler(app))
    config = WorkerConfig(
        queues=tuple(queues),
        concurrency=concurrency,
        lease=lease,
        heartbeat=lease / 3,
        grace=grace,
    )
    worker = Worker(app, config, services=services)
    loop = asyncio.get_running_loop()
    signals = {"n": 0}

    def on_signal(name: str) -> None:
        signals["n"] += 1
        if signals["n"] == 1:
            log.info("%s: finishing running jobs (again to stop at once)", name)
        worker.stop(immediate=signals["n"] > 1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    try:
        await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await app.broker.close()  # this loop's connections end with it
    return worker


async def drain(
    backend: DumbwaiterBackend,
    *,
    queues: Sequence[str],
    relay_url: str | None = None,
    timeout: float = 60.0,
) -> Worker:
    """Relay every committed outbox row, then run jobs until no job is ready
    or running on ``queues`` (jobs waiting for their eta or a retry stay),
    then return: for cron-style runs and for tests."""
    try:
        return await _drain(backend, queues, relay_url, timeout)
    finally:
        await backend.app.broker.close()  # this loop's connections end with it


async def _drain(
    backend: DumbwaiterBackend, queues: Sequence[str], relay_url: str | None, timeout: float
) -> Worker:
    if relay_url:
        relay = asyncio.create_task(Relay(backend.app, relay_url, poll=0.05).run())
        try:
            async with asyncio.timeout(timeout):
                while await asyncio.to_thread(_pending, backend.database):
                    if relay.done():
                        await relay  # it failed: raise why
                    await asyncio.sleep(0.02)
        finally:
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relay
    return await drain_queues(backend.app, queues, scheduled=False, timeout=timeout)


def _pending(database: str) -> int:
    """Outbox rows not relayed yet (on this thread's own Django connection)."""
    conn = connections[database]
    try:
        if "dw_outbox" not in conn.introspection.table_names():
            return 0
        with conn.cursor() as cur:
            cur.execute(_PENDING)
            return int(cur.fetchone()[0])
    finally:
        conn.close()
