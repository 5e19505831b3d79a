"""The app of the durable workflow crash test's worker processes
(``tests.crash.durableapp:app``)."""

from __future__ import annotations

import asyncio
import os

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"))
LOG = os.environ.get("DW_CRASH_LOG", os.devnull)
#: the five steps; the run sleeps between the second and the third
STEPS = ("reserve", "charge", "label", "ship", "notify")


def _record(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())  # one O_APPEND write: atomic
    finally:
        os.close(fd)


@app.workflow(name="crash.order", retry=dw.Retry(attempts=3, backoff=0.1, jitter=0))
async def order(ctx: dw.AsyncWorkflowContext, i: int) -> list[str]:
    async def step(name: str) -> str:
        _record(f"step {ctx.run_id} {name} {ctx.step_key} {os.getpid()}")
        await asyncio.sleep(0.02)  # long enough for a kill to find steps running
        return f"{name}-{i}"

    done = [await ctx.step(name, step, name) for name in STEPS[:2]]
    await ctx.sleep("cool-off", 1.0)
    done += [await ctx.step(name, step, name) for name in STEPS[2:]]
    return done
