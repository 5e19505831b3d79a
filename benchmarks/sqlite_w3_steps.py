"""Where a W3 pickup's time goes on the SQLite broker: timestamps of each
step in the worker, as ``benchmarks/nats_w3_steps.py`` does for NATS.

A W3-like run (one worker process, a warm-up job, 2 s idle, then N jobs 5 ms
apart, each a sync ``enqueue`` as the peers harness' SQLite adapter makes
it) with the worker's steps stamped by wrapping functions from outside
(nothing in ``src`` is changed):

* ``wake``: the WAL watch's file descriptor readable (wake.py);
* ``claim0`` / ``claim1``: the claim's transaction on the broker's thread
  (``_claim``: its ``BEGIN IMMEDIATE``, the promotion and the claim);
* ``fetched``: the fetch's return; ``start``: the handler's start.

Each is the median over jobs, in ms after the producer's call, with the
broker thread's CPU time beside the wall time of the claim; then the claims
that took a job: how many took over 0.9 ms (they met the producer's write
lock and waited for it) and their median.

    PYTHONPATH=SNAPSHOT/src .venv/bin/python benchmarks/sqlite_w3_steps.py [--n 400]

The database is ``w3s.db`` in ``DUMBWAITER_BENCH_DIR`` (default
``/tmp/dumbwaiter-bench``, as the harness' adapter), made afresh each run.
"""

from __future__ import annotations

import atexit
import os
import statistics
import time
from pathlib import Path
from typing import Any

from nats_w3_steps import event_log, main, report, run_worker, started, w3

import dumbwaiter as dw

DIR = Path(os.environ.get("DUMBWAITER_BENCH_DIR", "/tmp/dumbwaiter-bench")).resolve()
DB = DIR / "w3s.db"
app = dw.App(f"sqlite:///{DB}")


@app.task(name="noop")
async def noop(i: int) -> None:
    started(i)


STEPS = ("wake", "claim0", "claim1", "fetched", "start")


def _instrument(path: str) -> None:
    """Wrap the worker's pickup steps (in the worker process)."""
    from dumbwaiter.brokers.sqlite import broker as B
    from dumbwaiter.brokers.sqlite import wake as W

    note = event_log(path)
    claims: list[tuple[float, int]] = []

    def dump() -> None:
        with open(path + ".claims", "w") as f:
            f.writelines(f"{w:.6f} {n}\n" for w, n in claims)

    atexit.register(dump)
    on_readable = W.FileWaker._on_readable

    def _on_readable(self: Any) -> None:
        note("wake")
        on_readable(self)

    setattr(W.FileWaker, "_on_readable", _on_readable)  # noqa: B010
    claim = B.SQLiteBroker._claim

    def _claim(self: Any, *a: Any) -> Any:
        note("claim0")
        t = time.perf_counter()
        out = claim(self, *a)
        claims.append((time.perf_counter() - t, len(out[0])))
        if out[0]:
            note("claim1")
        return out

    setattr(B.SQLiteBroker, "_claim", _claim)  # noqa: B010
    fetch = B.SQLiteBroker.fetch

    async def _fetch(self: Any, *a: Any, **k: Any) -> Any:
        ds = await fetch(self, *a, **k)
        if ds:
            note("fetched")
        return ds

    setattr(B.SQLiteBroker, "fetch", _fetch)  # noqa: B010


def worker() -> None:
    run_worker("sqlite_w3_steps", _instrument)


def _fresh_db() -> None:
    DIR.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{DB}{suffix}").unlink(missing_ok=True)


def _claims(steps: str) -> None:
    """The claims that took a job: how many waited for the lock, the median."""
    rows = (ln.split() for ln in Path(f"{steps}.claims").read_text().splitlines())
    ms = sorted(float(w) * 1000 for w, n in rows if int(n))
    slow = sum(x > 0.9 for x in ms)
    print(
        f"claims that took a job: {len(ms)}, over 0.9 ms: {slow} ({slow / len(ms):.0%}),"
        f" median {statistics.median(ms):.3f} ms"
    )


async def produce(n: int, d: str) -> None:
    _fresh_db()
    calls = await w3(app, noop, n, d, __file__, sync=True)
    report(calls, f"{d}/done", f"{d}/steps", STEPS, STEPS[:-1], (("claim0", "claim1"),))
    _claims(f"{d}/steps")


if __name__ == "__main__":
    main(worker, produce)
