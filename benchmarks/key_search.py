"""Time a search by key (``JobFilter.key``) on a big SQLite or PostgreSQL broker.

    .venv/bin/python benchmarks/key_search.py sqlite [--jobs 1000000] [--db PATH] [--reuse]
    .venv/bin/python benchmarks/key_search.py postgres [--jobs 200000] [--dsn DSN]
        [--schema NAME] [--reuse]

Fills the broker through its own ``enqueue`` (batches of 10,000, so the bulk
path: multi-row INSERTs on SQLite, COPY on PostgreSQL; one job in 50 has a
key ``k:N``, one in 100 of those is an event delivery's key, and every
tenth keyed job's key was freed by a newer job), then moves jobs into their
states with plain SQL as ``dashboard_1m.py`` does (70 % succeeded, 8 %
dead, ...).  Then it times ``list_jobs`` by key (``--runs`` calls each,
median and worst): the whole database as ``jobs ls --key`` asks, one queue
as the dashboard's queue page asks, and a key nothing has (the worst case of
a scan).  It prints how long the first call took to open the broker too: on
a database filled by an older dumbwaiter, that includes the schema upgrade
(SQLite) or the migration (PostgreSQL, ``?migrate=auto``).

``--bulk-keyed`` times something else: one ``enqueue`` of 10,000 jobs that
all have a key (the bulk path with both key indexes fed per row), into a
fresh database or schema after a one-job warm-up, and prints jobs/s.

It uses the public API only, so the same script times any version: run it
with ``PYTHONPATH=<checkout>/src`` to time that checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import time

import dumbwaiter as dw
from dumbwaiter.brokers.types import JobFilter
from dumbwaiter.message import TASK, Message, uuid7

QUEUES = ["default", "mail", "reports", "bulk", "webhooks", "group:ledger"]
TASKS = ["app.send_mail", "app.build_report", "app.sync_crm", "app.notify", "app.export"]
BATCH = 10_000

# Moves jobs into their states by a bucket of a row number (as dashboard_1m.py).
SQLITE_STATES = [
    ("state='succeeded', attempt=1, expires_at=?", "rowid % 100 < 70"),
    ("state='dead', attempt=4, last_error_type='ValueError'", "rowid % 100 BETWEEN 70 AND 77"),
    ("state='scheduled', run_at=run_at + 3600", "rowid % 100 BETWEEN 78 AND 80"),
    ("state='cancelled', expires_at=?", "rowid % 100 BETWEEN 83 AND 84"),
]
PG_STATES = [
    ("state='succeeded', attempt=1, expires_at=now() + interval '1 day'", "n % 100 < 70"),
    ("state='dead', attempt=4, last_error_type='ValueError'", "n % 100 BETWEEN 70 AND 77"),
    ("state='scheduled', run_at=now() + interval '1 hour'", "n % 100 BETWEEN 78 AND 80"),
    ("state='cancelled', expires_at=now() + interval '1 day'", "n % 100 BETWEEN 83 AND 84"),
]


def key_of(n: int) -> str | None:
    return f"k:{n}" if n % 50 == 0 else None


async def fill(url: str, n: int) -> float:
    app = dw.App(url)
    rnd = random.Random(7)
    now = time.time()
    made = 0
    started = time.perf_counter()
    while made < n:
        size = min(BATCH, n - made)
        msgs = [
            Message(
                id=uuid7(),
                kind=TASK,
                name=rnd.choice(TASKS),
                queue=rnd.choice(QUEUES),
                args=[made + i, "user@example.com"],
                kwargs={"attempt_note": "x" * rnd.randint(0, 40)},
                max_attempts=4,
                created_at=now,
                key=key_of(made + i),
            )
            for i in range(size)
        ]
        await app.broker.enqueue(msgs)
        made += size
        if made % 100_000 == 0:
            print(f"  enqueued {made:,} ({made / (time.perf_counter() - started):,.0f}/s)")
    await app.aclose()
    return n / (time.perf_counter() - started)


def spread_sqlite(path: str) -> None:
    """States, plus what the old column alone misses: every tenth key freed (as
    a newer unique job does) and keys carried by event deliveries (kind event,
    key column NULL)."""
    c = sqlite3.connect(path)
    with c:
        for change, where in SQLITE_STATES:
            params = (time.time() + 86400,) if "?" in change else ()
            c.execute(f"UPDATE dw_jobs SET {change} WHERE {where}", params)
        c.execute("UPDATE dw_jobs SET key=NULL WHERE key IS NOT NULL AND rowid % 500 = 1")
        c.execute(
            "UPDATE dw_jobs SET key=NULL, kind='event' WHERE key IS NOT NULL AND rowid % 5000 = 51"
        )
    c.execute("ANALYZE")
    c.close()


def spread_postgres(dsn: str, schema: str) -> None:
    import psycopg

    jobs = f'"{schema}".dw_jobs'
    with psycopg.connect(dsn, autocommit=True) as c:
        with c.transaction():
            c.execute(
                f"CREATE TEMP TABLE n AS SELECT id, row_number() OVER (ORDER BY id) AS n"
                f" FROM {jobs}".encode()
            )
            for change, where in PG_STATES:
                c.execute(
                    f"UPDATE {jobs} j SET {change} FROM n WHERE n.id = j.id AND {where}".encode()
                )
            c.execute(
                f"UPDATE {jobs} j SET key = NULL FROM n WHERE n.id = j.id"
                " AND j.key IS NOT NULL AND n % 500 = 1".encode()
            )
            c.execute(
                f"UPDATE {jobs} j SET key = NULL, kind = 'event' FROM n WHERE n.id = j.id"
                " AND j.key IS NOT NULL AND n % 5000 = 51".encode()
            )
        c.execute(f"VACUUM ANALYZE {jobs}".encode())


async def bulk_keyed(url: str) -> float:
    """Jobs/s of one ``enqueue`` of 10,000 keyed jobs (after a one-job warm-up)."""
    broker = dw.App(url).broker
    await broker.enqueue([Message(id=uuid7(), kind=TASK, name="warm", queue="default")])
    tag = uuid7()
    msgs = [
        Message(id=uuid7(), kind=TASK, name="noop", queue="default", args=[i], key=f"{tag}:{i}")
        for i in range(10_000)
    ]
    t = time.perf_counter()
    await broker.enqueue(msgs)
    rate = len(msgs) / (time.perf_counter() - t)
    await broker.close()
    return rate


async def time_searches(url: str, n: int, runs: int) -> None:
    broker = dw.App(url).broker
    target = f"k:{(n // 2) // 50 * 50}"
    t0 = time.perf_counter()
    page = await broker.list_jobs(JobFilter(key=target), limit=50)
    opened = time.perf_counter() - t0
    [found] = page.items
    queue = found.message.queue
    print(f"first call (opens the broker, upgrades an older schema): {opened * 1000:,.0f} ms")
    cases: list[tuple[str, JobFilter, int]] = [
        (f"whole database, key {target} (jobs ls --key)", JobFilter(key=target), 1),
        (f"queue {queue}, key {target} (dashboard)", JobFilter(key=target, queue=queue), 1),
        ("whole database, a key no job has", JobFilter(key="k:none"), 0),
    ]
    print("| search | found | median | worst |")
    print("| --- | --- | --- | --- |")
    for name, f, expect in cases:
        times = []
        got = 0
        for _ in range(runs):
            t = time.perf_counter()
            got = len((await broker.list_jobs(f, limit=50)).items)
            times.append(time.perf_counter() - t)
        assert got == expect, (name, got)
        print(
            f"| {name} | {got} | {statistics.median(times) * 1000:,.1f} ms"
            f" | {max(times) * 1000:,.1f} ms |"
        )
    await broker.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("engine", choices=["sqlite", "postgres"])
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--db", default="/tmp/dumbwaiter-keysearch.db")
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--schema", default="dw_keysearch")
    ap.add_argument("--reuse", action="store_true", help="Search what is stored; fill nothing.")
    ap.add_argument("--fill-only", action="store_true", help="Fill, then stop.")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--bulk-keyed", action="store_true", help="Time a keyed bulk enqueue.")
    args = ap.parse_args()
    print(f"dumbwaiter from {os.path.dirname(dw.__file__)}")
    if args.engine == "sqlite":
        n = args.jobs or 1_000_000
        url = f"sqlite:///{args.db}"
        if not args.reuse or args.bulk_keyed:
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(args.db + suffix):
                    os.remove(args.db + suffix)
            if args.bulk_keyed:
                print(f"bulk enqueue of 10,000 keyed jobs: {asyncio.run(bulk_keyed(url)):,.0f}/s")
                return
            rate = asyncio.run(fill(url, n))
            spread_sqlite(args.db)
            print(f"filled {n:,} jobs ({rate:,.0f}/s)")
    else:
        import psycopg

        n = args.jobs or 200_000
        url = f"{args.dsn}?schema={args.schema}&migrate=auto"
        if not args.reuse or args.bulk_keyed:
            with psycopg.connect(args.dsn, autocommit=True) as c:
                c.execute(f'DROP SCHEMA IF EXISTS "{args.schema}" CASCADE'.encode())
            if args.bulk_keyed:
                print(f"bulk enqueue of 10,000 keyed jobs: {asyncio.run(bulk_keyed(url)):,.0f}/s")
                return
            rate = asyncio.run(fill(url, n))
            spread_postgres(args.dsn, args.schema)
            print(f"filled {n:,} jobs ({rate:,.0f}/s)")
    if not args.fill_only:
        asyncio.run(time_searches(url, n, args.runs))


if __name__ == "__main__":
    main()
