"""The app of test_event_crash.py's worker processes: one event type, two groups."""

from __future__ import annotations

import asyncio
import os

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"))
LOG = os.environ.get("DW_CRASH_LOG", os.devnull)


class Placed(dw.Event, type="crash.placed"):
    n: int


def _record(group: str, ctx: dw.Context) -> None:
    """One O_APPEND write (atomic): which delivery of which group started."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.job_id} {group} {ctx.event_id}\n".encode())
    finally:
        os.close(fd)


@app.subscribe(Placed, group="mail")
async def mail(event: Placed, ctx: dw.Context) -> None:
    _record("mail", ctx)
    await asyncio.sleep(0.01)  # a little time, so a kill finds deliveries in flight


@app.subscribe(Placed, group="books")
async def books(event: Placed, ctx: dw.Context) -> None:
    _record("books", ctx)
    await asyncio.sleep(0.01)
