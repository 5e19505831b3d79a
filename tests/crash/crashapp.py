"""The app the crash test's worker processes import (``tests.crash.crashapp:app``)."""

from __future__ import annotations

import asyncio
import os

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"))
LOG = os.environ.get("DW_CRASH_LOG", os.devnull)


@app.task(name="crash.work")
async def work(i: int, ctx: dw.Context) -> None:
    """Record that this job started (one O_APPEND write: atomic), then take a
    little time, so a kill finds jobs in flight."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.job_id} {os.getpid()} {ctx.attempt}\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(0.01)


@app.task(name="crash.shard")
async def shard(items: list[int], ctx: dw.Context) -> None:
    """A batch shard: record its start, then take a little time."""
    await work.fn(items[0], ctx)
