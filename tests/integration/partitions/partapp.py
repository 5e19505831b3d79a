"""The app the partition tests' worker hosts import
(``tests.integration.partitions.partapp:app``).

``part.work`` appends ``start ID HOST ATTEMPT`` to ``DW_PART_LOG`` when it
starts, takes ``DW_PART_SECONDS`` (so a cut finds jobs in flight), appends
``done ID HOST`` and returns its host's name, which becomes the job's
recorded result: the record shows which run's outcome was kept.  The
periodic ``part.tick`` (every second, on its own queue) appends ``tick KEY
HOST SCHEDULER JOB`` (the host that ran it, the scheduler replica that
enqueued it, the job's id).  Each line is one ``O_APPEND`` write (atomic between processes; the
hosts share the file system, not the network).
"""

from __future__ import annotations

import asyncio
import os

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_PART_URL", "memory://"))
LOG = os.environ.get("DW_PART_LOG", os.devnull)
HOST = os.environ.get("DW_PART_HOST", "?")
SECONDS = float(os.environ.get("DW_PART_SECONDS", "1.0"))


def _append(line: str) -> None:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(name="part.work", queue="part", keep_result=True)
async def work(n: int, ctx: dw.Context) -> str:
    _append(f"start {ctx.job_id} {HOST} {ctx.attempt}\n")
    await asyncio.sleep(SECONDS)
    _append(f"done {ctx.job_id} {HOST}\n")
    return HOST


@app.periodic(cron="* * * * * *", queue="ticks", name="part.tick")
def tick(ctx: dw.Context) -> None:
    by = (ctx.headers.get("periodic") or {}).get("by", "-")  # the scheduler: host:pid:random
    _append(f"tick {ctx.message.key} {HOST} {by} {ctx.job_id}\n")
