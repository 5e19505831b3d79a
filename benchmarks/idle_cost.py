"""What a short call costs after the process sat idle: the W3 pickup's tax.

W3 sends one job every 5 ms, so a worker is idle between any two pickups,
and on this machine (a Firecracker VM, guest halt-polling off:
``haltpoll.guest_halt_poll_ns=0`` on the kernel's command line) a vCPU that
idled comes back cold.  This prints, for idle gaps of 0, 0.5, 2 and 5 ms
before each call (medians of ``-n`` calls, in microseconds):

* ``getpid``: the first system call after the gap, then the next nine's mean;
* ``pread``: one 4 KiB read of a cached file;
* ``txn``: the admission's SQLite transaction as the RabbitMQ broker makes it
  (``BEGIN IMMEDIATE``, a 3-key read, a 2-row upsert of new values,
  ``COMMIT``; WAL, ``synchronous=NORMAL``), alone and with a second process
  writing the same file every 5 ms, as the producer's records do.

    .venv/bin/python benchmarks/idle_cost.py [-n 400]

The database is ``/tmp/dw-idle-cost.db`` (made anew), the file read
``/tmp/dw-idle-cost.bin``.  Standard library and
orjson only; run it under the benchmarks' flock.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sqlite3
import statistics
import time
from collections.abc import Callable

import orjson

PATH = "/tmp/dw-idle-cost.db"
#: what ``pread`` reads: not the database, whose locks closing any descriptor
#: of it would drop (POSIX), letting the writer reset the WAL index under us
READ = "/tmp/dw-idle-cost.bin"
GAPS = (0.0, 0.0005, 0.002, 0.005)
SELECT = (
    "SELECT key, value FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
    " AND (expires IS NULL OR expires > ?)"
)
UPSERT = (
    "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
    " DO UPDATE SET value=excluded.value, expires=excluded.expires"
)


def _connect() -> sqlite3.Connection:
    c = sqlite3.connect(PATH, isolation_level=None, timeout=5)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("PRAGMA cache_size=-32000")
    return c


def _fresh() -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(PATH + suffix)
        except FileNotFoundError:
            pass
    c = _connect()
    c.execute("CREATE TABLE dw_kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL)")
    rows = [(f"job:{i:08d}", os.urandom(300), None) for i in range(20_000)]
    c.executemany("INSERT INTO dw_kv VALUES (?,?,?)", rows)
    c.close()


def _writer(stop: mp.synchronize.Event, ready: mp.synchronize.Event) -> None:
    """The producer: a new record every 5 ms."""
    c = _connect()
    ready.set()
    i = 0
    while not stop.is_set():
        c.execute(UPSERT, (f"new:{i:08d}", os.urandom(300), None))
        i += 1
        time.sleep(0.005)


def _timed(gap: float, n: int, call: Callable[[int], object]) -> float:
    out = []
    for i in range(n):
        if gap:
            time.sleep(gap)
        t = time.perf_counter()
        call(i)
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6


def _syscalls(gap: float, n: int) -> tuple[float, float, float]:
    with open(READ, "wb") as f:
        f.write(os.urandom(1 << 16))
    fd = os.open(READ, os.O_RDONLY)
    first, rest = [], []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter()
        os.getpid()
        t1 = time.perf_counter()
        for _ in range(9):
            os.getpid()
        t2 = time.perf_counter()
        first.append(t1 - t0)
        rest.append((t2 - t1) / 9)
    pread = _timed(gap, n, lambda _: os.pread(fd, 4096, 0))
    os.close(fd)
    return statistics.median(first) * 1e6, statistics.median(rest) * 1e6, pread


def _txn(c: sqlite3.Connection) -> Callable[[int], object]:
    keys = orjson.dumps(["job:00000042", "gone:00000042", "paused:default"])

    def call(i: int) -> object:
        c.execute("BEGIN IMMEDIATE")
        got = {k: bytes(v) for k, v in c.execute(SELECT, (keys, time.time()))}
        lease = orjson.dumps({"at": time.time(), "i": i})
        c.executemany(UPSERT, [("job:00000042", os.urandom(300), None), ("lease:w", lease, None)])
        c.execute("COMMIT")
        return got

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", type=int, default=400)
    n = ap.parse_args().n
    _fresh()
    c = _connect()
    print(
        "| idle before the call | getpid, first | getpid, next | pread 4 KiB "
        "| txn alone | txn, another process writing |"
    )
    print("|--:|--:|--:|--:|--:|--:|")
    ctx = mp.get_context("spawn")
    for gap in GAPS:
        first, rest, pread = _syscalls(gap, n)
        alone = _timed(gap, n, _txn(c))
        stop, ready = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_writer, args=(stop, ready))
        proc.start()
        ready.wait(10)
        try:
            shared = _timed(gap, n, _txn(c))
        finally:
            stop.set()
            proc.join(10)
        print(
            f"| {gap * 1e3:.1f} ms | {first:.1f} | {rest:.2f} | {pread:.1f} "
            f"| {alone:.0f} | {shared:.0f} |"
        )


if __name__ == "__main__":
    main()
