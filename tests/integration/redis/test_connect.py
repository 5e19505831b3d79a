"""A worker started before its Redis (a container started before the
database, a deploy during a restart) waits for the server, trying again with
backoff, and works once it is up: it does not exit at its first call."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import dumbwaiter as dw
from tests.conftest import require_service
from tests.integration.serverproc import free_port

from .conftest import REDIS_SERVER, RedisServer


async def _until(cond: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Poll ``cond()`` (a log line of the worker's: nothing to wait on)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_a_worker_started_before_its_server_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require_service("redis-server", REDIS_SERVER is not None, "no redis-server binary on PATH")
    server = RedisServer(tmp_path, free_port())  # not started yet
    app = dw.App(server.url(prefix="early"))
    ran = asyncio.Event()

    @app.task
    async def hello() -> None:
        ran.set()

    caplog.set_level(logging.WARNING, logger="dumbwaiter.worker")
    worker = dw.Worker(app, concurrency=1, fetch_wait=0.2)
    run = asyncio.create_task(worker.run())
    try:
        await _until(
            lambda: run.done() or "trying again" in caplog.text,
            "the worker to find no server and try again",
        )
        assert not run.done(), "the worker must wait for its server, not exit"
        assert "is unavailable" in caplog.text  # it says why it waits
        await asyncio.to_thread(server.start)
        job = await hello.aenqueue()
        await asyncio.wait_for(ran.wait(), 30)
        assert job.id
        assert not run.done()
    finally:
        worker.stop()
        await asyncio.wait_for(run, 30)
        await app.aclose()
        server.stop(signal.SIGKILL)
