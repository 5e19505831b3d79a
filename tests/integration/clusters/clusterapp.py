"""The app the cluster tests' worker processes import
(``tests.integration.clusters.clusterapp:app``).

A job's argument is its number in the run.  Each job appends one line to
``DW_CLUSTER_STARTED`` when it starts (``id number pid attempt time``) and
one to ``DW_CLUSTER_DONE`` when its body has finished (``id number pid
time``), each one ``O_APPEND`` write (atomic: the two workers' lines never
interleave).  The number tells a job the producer was told about from one
whose enqueue raised, and shows a number that ran under two ids (an
enqueue the broker stored twice); the times show when the workers stalled.
"""

from __future__ import annotations

import asyncio
import os
import time

import dumbwaiter as dw

app = dw.App(os.environ.get("DW_CLUSTER_URL", "memory://"))
STARTED = os.environ.get("DW_CLUSTER_STARTED", os.devnull)
DONE = os.environ.get("DW_CLUSTER_DONE", os.devnull)


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(name="cluster.work")
async def work(n: int, ctx: dw.Context) -> None:
    """Record the start, take a little time (so a kill finds jobs in
    flight), record the finish."""
    _append(STARTED, f"{ctx.job_id} {n} {os.getpid()} {ctx.attempt} {time.time():.3f}\n")
    await asyncio.sleep(0.005)
    _append(DONE, f"{ctx.job_id} {n} {os.getpid()} {time.time():.3f}\n")
