"""Producer cost in the core: building and encoding the envelopes of a bulk enqueue.

What ``task.enqueue_many(range(n))`` (workload W2) costs before any broker
work: ``Task.messages`` (argument checks, ids, the ``Message`` objects,
headers) and ``encode_checked`` (the JSON bytes every broker stores).  No
broker is opened.  Prints microseconds per job, best of ``--repeat`` runs:

    build    list(task.messages(range(n), SendOptions()))
    encode   encode_checked(m, limit) over the built messages
    stream   both, one message at a time, as a broker consumes a lazy batch

To compare two trees side by side, run it under each one's ``src``:

    git archive HEAD~3 src | tar -x -C /tmp/dw-old
    PYTHONPATH=/tmp/dw-old/src python benchmarks/producer.py
    PYTHONPATH=src python benchmarks/producer.py

(``--json`` prints one JSON line instead of the table, for scripts.)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable

import dumbwaiter as dw
from dumbwaiter.message import DEFAULT_MAX_MESSAGE_SIZE, encode_checked
from dumbwaiter.task import SendOptions


async def anoop(i: int) -> None:  # the harness' W2 task shape: one int argument
    pass


def _best(fn: Callable[[], float], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        best = min(best, fn())
    return best


def measure(n: int, repeat: int) -> dict[str, float]:
    app = dw.App("memory://")  # never opened: only the task's producer side runs
    task = app.task(name="noop")(anoop)
    opts = SendOptions()
    limit = DEFAULT_MAX_MESSAGE_SIZE
    built: list[dw.Message] = []

    def build() -> float:
        nonlocal built
        built = []
        t0 = time.perf_counter()
        built = list(task.messages(range(n), opts))
        return time.perf_counter() - t0

    def encode() -> float:
        msgs = built
        t0 = time.perf_counter()
        for m in msgs:
            encode_checked(m, limit)
        return time.perf_counter() - t0

    def stream() -> float:
        t0 = time.perf_counter()
        for m in task.messages(range(n), opts):
            encode_checked(m, limit)
        return time.perf_counter() - t0

    out = {"n": float(n)}
    out["build_us"] = _best(build, repeat) / n * 1e6
    out["encode_us"] = _best(encode, repeat) / n * 1e6
    built = []
    out["stream_us"] = _best(stream, repeat) / n * 1e6
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, nargs="*", default=[10_000, 100_000], help="jobs per run")
    p.add_argument("--repeat", type=int, default=7, help="runs per figure (best is kept)")
    p.add_argument("--json", action="store_true", help="one JSON line per n")
    a = p.parse_args(argv)
    where = dw.__file__
    if not a.json:
        print(f"dumbwaiter from {where}")
        print(f"{'jobs':>8} {'build µs':>9} {'encode µs':>10} {'stream µs':>10} {'jobs/s':>9}")
    for n in a.n:
        r = measure(n, a.repeat)
        if a.json:
            print(json.dumps({**r, "src": where}))
        else:
            print(
                f"{n:>8,} {r['build_us']:>9.2f} {r['encode_us']:>10.2f} "
                f"{r['stream_us']:>10.2f} {1e6 / r['stream_us']:>9,.0f}"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
