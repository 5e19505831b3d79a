"""The app the crash test's worker processes import (``tests.crash.crashapp:app``).

Each job appends to three logs (one ``O_APPEND`` write each: atomic, so
concurrent jobs never interleave their lines): ``DW_CRASH_LOG`` when it
starts (``id pid attempt``), ``DW_CRASH_HELD`` when it holds (``id pid``)
and ``DW_CRASH_DONE`` when its body has finished (``id pid``).  While the
file ``DW_CRASH_HOLD`` exists, a job that starts holds still until it is
removed: the test creates it, waits until jobs say they hold, and kills the
worker then, so the kill lands mid-job whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import os

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"))
LOG = os.environ.get("DW_CRASH_LOG", os.devnull)
HELD = os.environ.get("DW_CRASH_HELD", os.devnull)
DONE = os.environ.get("DW_CRASH_DONE", os.devnull)
HOLD = os.environ.get("DW_CRASH_HOLD", "")


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _holding() -> bool:
    return bool(HOLD) and os.path.exists(HOLD)


@app.task(name="crash.work")
async def work(i: int, ctx: dw.Context) -> None:
    """Record that this job started, hold while the hold file exists, take a
    little time (so a kill finds jobs in flight), record that it finished."""
    _append(LOG, f"{ctx.job_id} {os.getpid()} {ctx.attempt}\n")
    if _holding():
        _append(HELD, f"{ctx.job_id} {os.getpid()}\n")
        while _holding():  # noqa: ASYNC110 - the test's file; it kills us meanwhile
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.01)
    _append(DONE, f"{ctx.job_id} {os.getpid()}\n")


@app.task(name="crash.shard")
async def shard(items: list[int], ctx: dw.Context) -> None:
    """A batch shard: the same as one job (it records, holds, finishes)."""
    await work.fn(items[0], ctx)
