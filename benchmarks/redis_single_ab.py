"""One Redis server, two source trees, alternated pairs: enqueue and drain.

    git archive main src | tar -x -C /tmp/dw-main
    python benchmarks/redis_single_ab.py /tmp/dw-main/src src [--pairs 5] [--n 10000]
        [--url redis://127.0.0.1:6379/1?prefix=ab]

For a change to the Redis broker that must not make one server slower.  Each
pair runs tree A then tree B (the order flips every pair), each in a fresh
process with that tree first on ``PYTHONPATH``:

* ``enqueue``: ``--m`` jobs enqueued one at a time (``task.enqueue``, the
  sync producer's round trip), jobs/s;
* ``drain``: ``--n`` jobs enqueued in bulk, then one real worker process
  (``dumbwaiter worker -c 32``) drains them, jobs/s from the first job's
  start to the last one's end (``redis_backlog.py``'s empty-queue drain).

Prints each pair and the median ratio B/A of each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

ONE = r"""
import json, sys, tempfile, time
from pathlib import Path
import dumbwaiter as dw
import redis_backlog as rb

url, n, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rb._clean(url)
app = dw.App(url)
noop = app.task(name="noop")(lambda i: None)
t = time.perf_counter()
for i in range(m):
    noop.enqueue(i)
enqueue = m / (time.perf_counter() - t)
rb._clean(url)
noop.enqueue_many(range(n))
folder = Path(tempfile.mkdtemp(prefix="dw-ab-"))
rb._write_app(folder)
drain = rb._drain(url, n, folder, 32)["jobs_per_s"]
rb._clean(url)
app.close()
print(json.dumps({"enqueue": enqueue, "drain": drain}))
"""


def run(tree: str, url: str, n: int, m: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tree).resolve()), str(HERE)])}
    out = subprocess.run(
        [sys.executable, "-c", ONE, url, str(n), str(m)],
        env=env, check=True, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--m", type=int, default=3_000)
    p.add_argument("--url", default="redis://127.0.0.1:6379/1?prefix=ab")
    a = p.parse_args()
    ratios: dict[str, list[float]] = {"enqueue": [], "drain": []}
    for i in range(a.pairs):
        order = (a.a, a.b) if i % 2 == 0 else (a.b, a.a)
        got = {tree: run(tree, a.url, a.n, a.m) for tree in order}
        ra, rb_ = got[a.a], got[a.b]
        for k in ratios:
            ratios[k].append(rb_[k] / ra[k])
        print(
            f"pair {i + 1}: A enqueue {ra['enqueue']:,.0f}/s drain {ra['drain']:,.0f}/s | "
            f"B enqueue {rb_['enqueue']:,.0f}/s drain {rb_['drain']:,.0f}/s | "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    for k, v in ratios.items():
        print(f"{k}: B/A median {statistics.median(v):.3f} (min {min(v):.3f}, max {max(v):.3f})")


if __name__ == "__main__":
    main()
