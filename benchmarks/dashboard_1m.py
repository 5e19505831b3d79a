"""Time every dashboard page over a SQLite broker holding 1,000,000 jobs.

    .venv/bin/python benchmarks/dashboard_1m.py [--jobs 1000000] [--db PATH] [--reuse]

Fills the database through the broker's own ``enqueue`` (batches of 10,000),
then moves jobs into their states with plain SQL (a worker would take hours
to fail 80,000 jobs twice): 70 % succeeded, 15 % ready, 8 % dead (with an
error), 3 % scheduled, 2 % retrying, 2 % cancelled, over five queues and a
subscriber group.  Then it requests each page in-process (Starlette's
TestClient, no network) and prints the median and worst of ``--runs``
requests, twice: with stats read on every request (``--refresh 0``, the
worst case) and with the dashboard's default 2 s stats cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dumbwaiter as dw
from dumbwaiter.message import TASK, Message, uuid7

QUEUES = ["default", "mail", "reports", "bulk", "webhooks", "group:ledger"]
TASKS = ["app.send_mail", "app.build_report", "app.sync_crm", "app.notify", "app.export"]
BATCH = 10_000


async def fill(url: str, n: int) -> None:
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
                created_at=now - (n - made - i) * 0.01,
                key=f"k:{made + i}" if (made + i) % 50 == 0 else None,
            )
            for i in range(size)
        ]
        await app.broker.enqueue(msgs)
        made += size
        if made % 100_000 == 0:
            rate = made / (time.perf_counter() - started)
            print(f"  enqueued {made:,} ({rate:,.0f}/s)", flush=True)
    await app.aclose()


def spread_states(path: str) -> None:
    """Move jobs into their states by rowid buckets (plain SQL, one transaction)."""
    now = time.time()
    error = orjson.dumps(
        [
            {
                "time": now - 60,
                "type": "ValueError",
                "message": "partner said no",
                "traceback": "Traceback (most recent call last):\n  ...\n"
                "ValueError: partner said no",
                "worker": "bench:1",
                "attempt": 4,
            }
        ]
    ).decode()
    c = sqlite3.connect(path)
    with c:
        c.execute(
            "UPDATE dw_jobs SET state='succeeded', attempt=1, updated_at=run_at + 1,"
            " expires_at=? WHERE rowid % 100 < 70",
            (now + 86400,),
        )
        c.execute(
            "UPDATE dw_jobs SET state='dead', attempt=4, errors=?, last_error_type='ValueError',"
            " updated_at=run_at + 30 WHERE rowid % 100 BETWEEN 70 AND 77",
            (error,),
        )
        c.execute(
            "UPDATE dw_jobs SET state='scheduled', run_at=? WHERE rowid % 100 BETWEEN 78 AND 80",
            (now + 3600,),
        )
        c.execute(
            "UPDATE dw_jobs SET state='scheduled', attempt=1, errors=?, run_at=?"
            " WHERE rowid % 100 BETWEEN 81 AND 82",
            (error, now + 300),
        )
        c.execute(
            "UPDATE dw_jobs SET state='cancelled', updated_at=run_at, expires_at=?"
            " WHERE rowid % 100 BETWEEN 83 AND 84",
            (now + 86400,),
        )
        # rowid % 100 in 85..99: ready (as enqueued)
    c.execute("ANALYZE")
    c.close()


async def announce(url: str) -> None:
    """Four live workers and an hour of throughput samples."""
    from dumbwaiter.throughput import PREFIX, minute_of

    app = dw.App(url)
    now = time.time()
    workers = {}
    for i in range(4):
        info = {
            "id": f"bench:{i}",
            "queues": QUEUES,
            "concurrency": 32,
            "inflight": 7,
            "started_at": now - 7200,
            "heartbeat_at": now,
            "counts": {"succeeded": 100_000 + i, "retried": 100, "dead": 10},
        }
        workers[f"worker:bench:{i}"] = orjson.dumps(info)
    await app.broker.kv_set(workers, ttl=3600)
    m = minute_of(now)
    samples = {
        f"{PREFIX}{m - k}": orjson.dumps(
            {"at": now - 60 * k, "workers": {"bench:0": [100_000 - 900 * k, 100, 10, now - 7200]}}
        )
        for k in range(61)
    }
    await app.broker.kv_set(samples, ttl=7200)
    await app.aclose()


def pages(some_id: str, deep_cursor: str) -> list[tuple[str, str]]:
    return [
        ("overview", "/"),
        ("queue, all states", "/queues/mail"),
        ("queue, ready", "/queues/mail?state=ready"),
        ("queue, succeeded", "/queues/mail?state=succeeded"),
        ("queue, succeeded, deep page", f"/queues/mail?state=succeeded&cursor={deep_cursor}"),
        ("queue, 200 per page", "/queues/mail?state=ready&limit=200"),
        ("queue, by task", "/queues/mail?state=dead&task=app.notify"),
        ("queue, by key (exact, every job)", "/queues/mail?key=k:500000"),
        ("queue, by time", "/queues/mail?state=succeeded&since=2h"),
        # the worst cases: a filter nothing matches reads the whole (queue, state)
        ("queue, by task, no match", "/queues/mail?state=succeeded&task=app.nope"),
        ("queue, by time, no match", "/queues/mail?state=succeeded&until=2000-01-01"),
        ("queue, by id", f"/queues/mail?id={some_id}"),
        ("job detail", f"/jobs/{some_id}"),
        ("dead letters, all queues", "/dead"),
        ("dead letters, one queue", "/dead?queue=mail"),
        ("dead letters, by error", "/dead?queue=mail&error=ValueError"),
        ("workers", "/workers"),
        ("schedules", "/schedules"),
        ("alerts", "/alerts"),
        ("metrics", "/metrics"),
    ]


def time_pages(url: str, refresh: float, runs: int) -> list[tuple[str, float, float, int]]:
    from starlette.testclient import TestClient

    from dumbwaiter.dashboard import create_app

    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    some_id = c.execute("SELECT id FROM dw_jobs WHERE state='dead' LIMIT 1").fetchone()[0]
    # a cursor in the middle of mail's succeeded jobs (page ~2,000 of 50)
    total = c.execute(
        "SELECT count(*) FROM dw_jobs WHERE queue='mail' AND state='succeeded'"
    ).fetchone()[0]
    deep = c.execute(
        "SELECT id FROM dw_jobs WHERE queue='mail' AND state='succeeded'"
        " ORDER BY id LIMIT 1 OFFSET ?",
        (total // 2,),
    ).fetchone()[0]
    c.close()
    out = []
    star = create_app(url, refresh=refresh, sample=False)
    with TestClient(star, client=("127.0.0.1", 1), follow_redirects=False) as client:
        client.get("/")  # open the broker
        for name, path in pages(some_id, deep):
            times = []
            status = 0
            for _ in range(runs):
                t0 = time.perf_counter()
                r = client.get(path)
                times.append(time.perf_counter() - t0)
                status = r.status_code
            out.append((name, statistics.median(times), max(times), status))
    return out


async def time_stats(url: str, runs: int) -> tuple[float, float]:
    app = dw.App(url)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await app.broker.stats()
        times.append(time.perf_counter() - t0)
    await app.aclose()
    return statistics.median(times), max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--db", default="/tmp/dumbwaiter-dashboard-1m.db")
    ap.add_argument("--reuse", action="store_true", help="Use an existing database as it is.")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    url = f"sqlite:///{args.db}"
    if not (args.reuse and os.path.exists(args.db)):
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(args.db + suffix):
                os.remove(args.db + suffix)
        print(f"filling {args.db} with {args.jobs:,} jobs")
        t0 = time.perf_counter()
        asyncio.run(fill(url, args.jobs))
        spread_states(args.db)
        asyncio.run(announce(url))
        print(f"filled in {time.perf_counter() - t0:.0f} s")
    n = sqlite3.connect(args.db).execute("SELECT count(*) FROM dw_jobs").fetchone()[0]
    print(f"{n:,} jobs stored; {args.runs} requests per page\n")
    med, worst = asyncio.run(time_stats(url, args.runs))
    print(f"broker.stats() alone: median {med * 1000:.0f} ms, worst {worst * 1000:.0f} ms\n")
    cold = time_pages(url, 0.0, args.runs)
    warm = time_pages(url, 2.0, args.runs)
    print("| page | status | stats per request: median / worst | cached stats: median / worst |")
    print("| --- | --- | --- | --- |")
    for (name, m1, w1, status), (_, m2, w2, _) in zip(cold, warm, strict=True):
        print(
            f"| {name} | {status} | {m1 * 1000:.0f} / {w1 * 1000:.0f} ms"
            f" | {m2 * 1000:.0f} / {w2 * 1000:.0f} ms |"
        )


if __name__ == "__main__":
    main()
