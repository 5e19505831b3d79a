"""W4 in one process: the worker's own share of the 10 ms jobs' drain.

2,000 jobs that each ``await asyncio.sleep(0.01)`` are enqueued, then one
``Worker`` at concurrency 50 drains them on the loop the CLI would choose
(uvloop by default), after the CLI's ``gc.freeze``.  Each job records its
start and end as the harness' task bodies do; the figures are
``benchmarks/w4_waves.py``'s (drain, efficiency, overshoot, ramp, gaps,
refill gap), plus the process CPU time of the drain per job.  With
``memory://`` there is no network at all, which separates the worker from the
broker.

    python benchmarks/w4_inproc.py --url memory:// --reps 5
    python benchmarks/w4_inproc.py --url 'redis://127.0.0.1:6379/5?prefix=w4' --reps 3
    python benchmarks/w4_inproc.py --url sqlite:////tmp/w4.db --loop asyncio
    python benchmarks/w4_inproc.py --bare       # the loop's ceiling: sleeps only
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import w4_waves

import dumbwaiter as dw
from dumbwaiter.loop import run as run_on


def once(url: str, loop: str, n: int, concurrency: int) -> dict[str, float]:
    if url.startswith("redis://") and "prefix=" in url:
        url = f"{url}{uuid.uuid4().hex[:6]}"
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
    app = dw.App(url)
    rec: list[tuple[float, float]] = []
    done = asyncio.Event()
    dry = [0]  # job ends that found the prefetch buffer empty
    fetches: list[tuple[float, int]] = []  # (seconds, jobs) of each fetch while draining
    worker: list[dw.Worker] = []

    @app.task(name="sleep10ms")
    async def sleep10ms(i: int) -> None:
        t0 = time.monotonic()
        await asyncio.sleep(0.01)
        rec.append((t0, time.monotonic()))
        if not worker[0]._buffer and len(rec) < n - concurrency:
            dry[0] += 1
        if len(rec) == n:
            done.set()

    async def main() -> float:
        nonlocal done
        done = asyncio.Event()
        await sleep10ms.aenqueue_many(range(n))
        w = dw.Worker(app, queues=("default",), concurrency=concurrency)
        worker.append(w)
        fetch = w.broker.fetch

        async def timed_fetch(*a: Any, **kw: Any) -> Any:
            t = time.monotonic()
            out = await fetch(*a, **kw)
            if out and len(rec) < n:
                fetches.append((time.monotonic() - t, len(out)))
            return out

        w.broker.fetch = timed_fetch  # type: ignore[method-assign]
        runner = asyncio.create_task(w.run())
        cpu0 = time.process_time()
        await done.wait()
        cpu = time.process_time() - cpu0
        w.stop()
        await runner
        await app.broker.close()
        return cpu

    gc.collect()
    gc.freeze()
    cpu = run_on(main(), loop)
    r = w4_waves.analyse(sorted(rec), concurrency)
    r["cpu_us"] = cpu / n * 1e6
    r["dry%"] = dry[0] / n * 100
    r["fetches"] = len(fetches)
    r["fetch_ms"] = sum(t for t, _ in fetches) / max(1, len(fetches)) * 1000
    r["fetch_n"] = sum(k for _, k in fetches) / max(1, len(fetches))
    return r


def bare(loop: str, n: int, concurrency: int) -> dict[str, float]:
    """The loop's own ceiling: ``concurrency`` tasks that only sleep 10 ms in
    turn, ``n`` sleeps in all, no worker and no broker."""
    rec: list[tuple[float, float]] = []

    async def slot(k: int) -> None:
        for _ in range(k):
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            rec.append((t0, time.monotonic()))

    async def main() -> float:
        cpu0 = time.process_time()
        await asyncio.gather(*(slot(n // concurrency) for _ in range(concurrency)))
        return time.process_time() - cpu0

    gc.collect()
    gc.freeze()
    cpu = run_on(main(), loop)
    r = w4_waves.analyse(sorted(rec), concurrency)
    r["cpu_us"] = cpu / len(rec) * 1e6
    r["dry%"] = r["fetches"] = r["fetch_ms"] = r["fetch_n"] = 0.0
    return r


def _fmt(x: float) -> str:
    return f"{x:,.3f}" if x < 1 else f"{x:,.2f}" if x < 100 else f"{x:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="memory://")
    p.add_argument("--loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("-c", "--concurrency", type=int, default=50)
    p.add_argument("--bare", action="store_true", help="the loop alone: sleeps, no worker")
    a = p.parse_args()
    cols = ["rate", "eff", "sleep_p50", "sleep_p90", "busy_avg", "over%", "ramp%", "tail%"]
    cols += ["gaps%", "refill_p50", "refill_p90", "waves", "cpu_us", "dry%", "fetches"]
    cols += ["fetch_ms", "fetch_n"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "--:|" * len(cols))
    for _ in range(a.reps):
        r = bare(a.loop, a.n, a.concurrency) if a.bare else once(a.url, a.loop, a.n, a.concurrency)
        print("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
