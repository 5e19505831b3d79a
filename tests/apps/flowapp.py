"""The app of the flow-control process tests: ``tests.apps.flowapp:app``.

Handlers append their start time (as the worker stamped it) and their
(key, start, end) to the file in ``$FLOWAPP_LOG``: one write(2) each.
"""

from __future__ import annotations

import asyncio
import os
import time

import dumbwaiter as dw

app = dw.App(os.environ.get("FLOWAPP_URL", "memory://"), retry=dw.Retry.never())


def _record(line: str) -> None:
    fd = os.open(os.environ["FLOWAPP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task(name="flow.api_call", rate_limit="50/s")
async def api_call(n: int, ctx: dw.Context) -> None:
    _record(f"rate {ctx.started_at:.6f} {os.getpid()}")


@app.task(name="flow.tenant_job", concurrency=3, limit_key=lambda a: a["tenant"])
async def tenant_job(tenant: str, n: int) -> None:
    start = time.time()
    await asyncio.sleep(0.01)
    _record(f"conc {tenant} {start:.6f} {time.time():.6f}")
