"""Pauses of the worker's event loop, seen from its jobs (W4's shape).

2,000 jobs that each ``await asyncio.sleep(0.01)`` run in one ``dumbwaiter
worker -c 50`` process; each records its start and end, and the script prints
the drain rate, the median sleep and the longest one.  A loop that stops for
a while (a full garbage collection of everything start-up built, say) shows
as a wave of jobs that sleep far past 10 ms and end together.

    python benchmarks/loop_stall.py --url 'redis://127.0.0.1:6379/5?prefix=stall' --loop uvloop
    python benchmarks/loop_stall.py --url sqlite:////tmp/stall.db --loop asyncio --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

N = 2000

if os.environ.get("STALL_OUT"):  # imported by the worker process: the app
    import dumbwaiter as dw

    app = dw.App(os.environ["STALL_URL"])
    _rec: list[tuple[float, float]] = []

    def _write(path: str, rows: list[tuple[float, float]]) -> None:
        with open(path, "w") as f:
            f.writelines(f"{a} {b}\n" for a, b in rows)

    @app.task
    async def asleep10ms(i: int) -> None:
        s = time.monotonic()
        await asyncio.sleep(0.01)
        _rec.append((s, time.monotonic()))
        if len(_rec) == N:
            _write(os.environ["STALL_OUT"], _rec)  # once, after the measured part
            os.kill(os.getpid(), signal.SIGTERM)


def once(url: str, loop: str) -> str:
    out = os.path.join(tempfile.mkdtemp(), "times")
    env = {**os.environ, "STALL_URL": url, "STALL_OUT": out}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__))])
    enqueue = "import loop_stall as m; m.asleep10ms.enqueue_many(range(m.N))"
    subprocess.run([sys.executable, "-c", enqueue], env=env, check=True)
    cmd = ["dumbwaiter", "worker", "--app", "loop_stall:app", "-q", "default", "-c", "50"]
    subprocess.run([*cmd, "--loop", loop, "--log-level", "WARNING"], env=env, check=True)
    with open(out) as f:
        rows = [tuple(map(float, line.split())) for line in f]
    took = sorted((b - a) * 1000 for a, b in rows)
    span = max(b for _, b in rows) - min(a for a, _ in rows)
    slow = sum(t > 20 for t in took)
    return (
        f"{loop:8} {N / span:7,.0f} jobs/s  median sleep {took[len(took) // 2]:.2f} ms  "
        f"longest {took[-1]:.1f} ms  over 20 ms: {slow}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="broker URL (a fresh namespace is best)")
    p.add_argument("--loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    p.add_argument("--reps", type=int, default=1)
    a = p.parse_args()
    for _ in range(a.reps):
        url = a.url
        if url.startswith("redis://") and "prefix=" in url:
            url = f"{url}{uuid.uuid4().hex[:6]}"  # a fresh prefix each repetition
        print(once(url, a.loop), flush=True)


if __name__ == "__main__":
    main()
