"""CPU a job of the worker's own path, ``Worker._process``, with no broker
I/O: what the worker does between a fetched delivery and its outcome handed
to the settler (the attempt, its middleware and lifecycle hooks, the cancel
registry, the record, the run-time averages).  The drain's other parts (the
claim, the ack, the engine's parsing) are not in it; ``worker_calls.py``
counts the whole path on Redis.

    PYTHONPATH=src python benchmarks/worker_path.py
    PYTHONPATH=/tmp/dw-old/src python benchmarks/worker_path.py   # another tree

Jobs are made and dropped 100 at a time, as a worker's in-flight ones are
(keeping every delivery and its record alive makes the allocator, not the
worker, the cost); each figure is the fastest of seven rounds of 20,000 jobs,
which a loaded machine moves far less than a mean.  The App is never
connected (the URL only names the engine).  Runs on trees back to
``f6ac456``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import dumbwaiter as dw

try:
    from dumbwaiter.brokers.types import Delivery
except ImportError:  # trees before brokers/types.py
    from dumbwaiter.brokers.base import Delivery  # type: ignore[attr-defined]

N = 20_000
CHUNK = 100
ROUNDS = 7


async def main() -> None:
    app = dw.App("redis://127.0.0.1:6379/14?prefix=worker-path")

    @app.task(name="noop")
    async def noop(i: int) -> None:
        pass

    w = dw.Worker(app, queues=("default",), concurrency=32)
    w._loop = asyncio.get_running_loop()

    def message(i: int) -> Any:
        try:
            return noop.message((i,), {})
        except TypeError:  # older trees take the send options too
            from dumbwaiter.task import SendOptions

            return noop.message((i,), {}, SendOptions())

    best = float("inf")
    for _ in range(ROUNDS):
        spent = 0.0
        for _ in range(N // CHUNK):
            ds = []
            for i in range(CHUNK):
                m = message(i)
                m.attempt = 1
                d = Delivery(id=m.id, message=m, token=1, lease_until=0.0, queue="default")
                ds.append(d)
                w._inflight[d.id] = d
            t = time.process_time()
            for d in ds:
                await w._process(d)
            spent += time.process_time() - t
            for pending in w._settler.pending.values():
                pending.clear()
        best = min(best, spent)
    print(f"worker path: {best * 1e6 / N:.2f} us CPU a job (fastest of {ROUNDS} x {N:,})")


if __name__ == "__main__":
    asyncio.run(main())
