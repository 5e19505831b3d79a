"""Server cost of a bulk enqueue's scripts on Redis, per job: staging and commit.

    .venv/bin/python benchmarks/redis_bulk_cost.py [--rev af01834] [--port 6391] [--reps 5]
    .venv/bin/python benchmarks/redis_bulk_cost.py --rev af01834 --port 6392 --callgrind

10,000 no-op jobs (the harness' W2 batch) are encoded once, by this tree's
``bulk.encode``, then staged in chunks of 1,000 (``enqueue.lua`` in stage
mode) and committed (``commit.lua``), then sent again the plain way (one
``enqueue.lua`` call a chunk, as a batch of up to 1,000 is) on a redis-server of its own, once with
the scripts of git revision ``--rev`` and once with this tree's, alternately.
Each phase is measured by the server: ``INFO commandstats`` (µs in
``EVALSHA`` per job; wall time inside the server, so a loaded machine
inflates it), or with ``--callgrind`` the instructions the server ran per job,
which do not depend on the load.  For the latter, start the server under
valgrind first (it runs ~50x slower; only this script talks to it):

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg/cg.%p \\
        redis-server --port 6392 --save '' --appendonly no &

The server is flushed before each run: use one nobody else uses.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import time
from collections.abc import Callable

import redis

import dumbwaiter as dw
from dumbwaiter.brokers.redis import bulk, lua
from dumbwaiter.task import _NO_OPTIONS

PREFIX = b"{dw:bench}"
N = 10_000


def expand(rev: str, name: str) -> str:
    """A script's text at git revision ``rev`` (``-``: this tree), includes expanded."""
    if rev == "-":
        return lua._expand(name)
    path = f"src/dumbwaiter/brokers/redis/scripts/{name}.lua"
    text = subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True)
    out = []
    for line in text.splitlines():
        if line.startswith("--@include "):
            out.append(expand(rev, line[len("--@include ") :].strip()))
        else:
            out.append(line)
    return "\n".join(out)


def callgrind_counter(port: int) -> Callable[[], int]:
    """Instructions the valgrind'ed server on ``port`` ran since the last call."""
    pid = subprocess.check_output(["pgrep", "-f", f"valgrind.bin.*port {port}"], text=True).split()[
        0
    ]
    out = subprocess.check_output(["ps", "-o", "args=", "-p", pid], text=True)
    pattern = out.split("--callgrind-out-file=")[1].split()[0].replace("%p", pid)

    def dump() -> int:
        for f in glob.glob(pattern + "*"):
            os.remove(f)
        subprocess.check_call(["callgrind_control", "-d", pid], stdout=subprocess.DEVNULL)
        for _ in range(50):
            for f in glob.glob(pattern + "*"):
                with open(f) as fh:
                    for line in fh:
                        if line.startswith("summary:"):
                            return int(line.split()[1])
            time.sleep(0.1)
        raise RuntimeError("no callgrind dump")

    return dump


def w2_chunks(port: int) -> list[bulk.Chunk]:
    """The staging chunks of W2's bulk enqueue (``N`` no-op jobs), encoded
    once, as the producer sends them: what every measured call replays."""
    app = dw.App(f"redis://127.0.0.1:{port}/0?prefix=bench")

    async def noop(i: int) -> None:
        pass

    task = app.task(name="noop")(noop)
    try:
        return list(bulk.encode(task.messages(range(N), _NO_OPTIONS), None))
    finally:
        app.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rev", default="af01834", help="git revision to compare with this tree")
    ap.add_argument("--port", type=int, default=6391)
    ap.add_argument("--reps", type=int, help="rounds, alternately (default: 5; 1 with --callgrind)")
    ap.add_argument("--callgrind", action="store_true", help="count the server's instructions")
    a = ap.parse_args()
    r = redis.Redis(port=a.port)
    chunks = w2_chunks(a.port)
    # phase(): the server's cost since the previous phase() call
    if a.callgrind:
        phase = callgrind_counter(a.port)  # a dump restarts the count
        unit = "instructions"
    else:
        last = [0]

        def phase() -> int:
            usec = int(r.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
            spent, last[0] = usec - last[0], usec
            return spent

        unit = "us"
    figures: dict[str, tuple[list[float], list[float], list[float]]] = {
        a.rev: ([], [], []),
        "tree": ([], [], []),
    }
    for rep in range(a.reps or (1 if a.callgrind else 5)):
        for rev in [a.rev, "tree"] if rep % 2 == 0 else ["tree", a.rev]:
            src = "-" if rev == "tree" else rev
            r.flushall()
            se = r.script_load(expand(src, "enqueue"))
            sc = r.script_load(expand(src, "commit"))
            call = f"cost-{rep}-{rev}"
            phase()
            for i, ch in enumerate(chunks):
                mode, deadline = (b"stage1", repr(time.time() + 600)) if i == 0 else (b"stage", "")
                r.evalsha(se, 1, PREFIX, repr(time.time()), mode, call, deadline, *ch.args)
            figures[rev][0].append(phase() / N)
            r.evalsha(sc, 1, PREFIX, repr(time.time()), call)
            figures[rev][1].append(phase() / N)
            assert r.zcard(PREFIX + b":ready:default") == N
            # the same chunks the plain way (mode ''): what a batch of up to
            # 1,000 jobs costs, one call each
            r.flushall()
            phase()
            for ch in chunks:
                r.evalsha(se, 1, PREFIX, repr(time.time()), b"", "", "", *ch.args)
            figures[rev][2].append(phase() / N)
            assert r.zcard(PREFIX + b":ready:default") == N
    for rev, (stage, comm, plain) in figures.items():
        s, c, p = statistics.median(stage), statistics.median(comm), statistics.median(plain)
        print(
            f"{rev:>10}: staging {s:,.2f}  commit {c:,.2f}  total {s + c:,.2f}  "
            f"plain {p:,.2f} {unit} per job"
        )


if __name__ == "__main__":
    main()
