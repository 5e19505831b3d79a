"""The app of the durable workflow crash test's worker processes
(``tests.crash.durableapp:app``).

While the hold file (``DW_CRASH_HOLD``) exists, runs stop where the test
wants a kill to find them, and say so in the log: an even run holds in the
middle of a step's function (``held-step``), an odd one between two steps,
right after a step it ran itself returned (``held-between``, never while
replaying checkpoints).  The test kills the worker once both kinds hold.
"""

from __future__ import annotations

import asyncio
import os

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CRASH_URL", "memory://"))
LOG = os.environ.get("DW_CRASH_LOG", os.devnull)
HOLD = os.environ.get("DW_CRASH_HOLD", "")
#: the five steps; the run sleeps between the second and the third
STEPS = ("reserve", "charge", "label", "ship", "notify")


def _record(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())  # one O_APPEND write: atomic
    finally:
        os.close(fd)


def _holding() -> bool:
    return bool(HOLD) and os.path.exists(HOLD)


async def _hold(line: str) -> None:
    """Hold while the hold file exists, once said in the log (on the loop:
    a thread each would fill the default executor the worker needs)."""
    if not _holding():
        return
    _record(line)
    while _holding():  # noqa: ASYNC110 - the test's file; it kills us meanwhile
        await asyncio.sleep(0.01)


@app.workflow(name="crash.order", retry=dw.Retry(attempts=3, backoff=0.1, jitter=0))
async def order(ctx: dw.AsyncWorkflowContext, i: int) -> list[str]:
    ran_here: list[str] = []  # the steps whose function ran in this segment

    async def step(name: str) -> str:
        _record(f"step {ctx.run_id} {name} {ctx.step_key} {os.getpid()}")
        ran_here.append(name)
        if i % 2 == 0:
            await _hold(f"held-step {ctx.run_id} {name} {os.getpid()}")
        await asyncio.sleep(0.02)  # long enough for a kill to find steps running
        return f"{name}-{i}"

    async def run(name: str) -> str:
        done: str = await ctx.step(name, step, name)
        if i % 2 == 1 and ran_here[-1:] == [name] and name != STEPS[-1]:
            # its checkpoint is stored, the next step not begun
            await _hold(f"held-between {ctx.run_id} {name} {os.getpid()}")
        return done

    done = [await run(name) for name in STEPS[:2]]
    await ctx.sleep("cool-off", 1.0)
    done += [await run(name) for name in STEPS[2:]]
    return done
