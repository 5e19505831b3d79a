"""Python calls (cProfile's count) and CPU per job of an in-process worker
draining 5,000 no-op jobs, for a broker change that must add nothing to the
worker's path: the call count barely depends on the machine's load, which a
drain rate on a shared machine does.

    PYTHONPATH=src python benchmarks/worker_calls.py "redis://127.0.0.1:6379/14?prefix=calls-1"
    PYTHONPATH=/tmp/dw-main/src python benchmarks/worker_calls.py "redis://...?prefix=calls-2"

Use a fresh prefix each run (its jobs are left behind).  With
``--no-profile`` it prints only the CPU a job, without cProfile's own cost
(which is most of the profiled figure): the whole path's CPU, to compare
trees by the fastest of a few alternated runs.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import sys
import time

import dumbwaiter as dw

N = 5000
url = sys.argv[1]
profiled = "--no-profile" not in sys.argv[2:]


async def main() -> None:
    app = dw.App(url)
    done = 0
    finished = asyncio.Event()

    @app.task(name="noop")
    async def noop(i: int) -> None:
        nonlocal done
        done += 1
        if done == N:
            finished.set()

    for i in range(0, N, 1000):
        noop.enqueue_many(range(i, i + 1000))
    w = dw.Worker(app, queues=("default",), concurrency=32)
    prof = cProfile.Profile()
    if profiled:
        prof.enable()
    running = asyncio.create_task(w.run())
    t = time.process_time()
    await asyncio.wait_for(finished.wait(), 300)
    cpu = time.process_time() - t
    prof.disable()
    w.stop()
    await running
    await app.aclose()
    if not profiled:
        print(f"cpu us/job {cpu * 1e6 / N:.1f}")
        return
    st = pstats.Stats(prof)
    print(f"calls/job {st.total_calls / N:.1f}  cpu us/job {cpu * 1e6 / N:.0f}")


if __name__ == "__main__":
    asyncio.run(main())
