"""Outbox relay throughput: committed dw_outbox rows moved to the broker per second.

    python benchmarks/outbox_relay.py [--rows 20000] [--broker sqlite|postgres]
                                      [--source sqlite|postgres]

Writes ROWS task messages through app.outbox(conn) into the source database
(in transactions of 1,000), then runs one Relay until the outbox is empty and
reports rows relayed per second (read, send to the broker, mark relayed).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

import dumbwaiter as dw
from dumbwaiter.relay import Relay

PG = "postgresql://postgres@127.0.0.1:5432/test"
PG_BROKER = "postgresql://postgres@127.0.0.1:5432/postgres"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--broker", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--source", choices=["sqlite", "postgres"], default="sqlite")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dw-relay-"))
    broker_url = f"sqlite:///{tmp}/broker.db"
    if args.broker == "postgres":
        # the broker in another database than the source: in the same one,
        # the outbox inserts the jobs themselves in the caller's transaction
        # (the same-database fast path) and there is nothing to relay
        broker_url = f"{PG_BROKER}?schema=dw_relay_bench&migrate=auto"
    app = dw.App(broker_url)

    @app.task(name="bench.noop")
    def noop(n: int) -> None: ...

    if args.source == "sqlite":
        source = f"sqlite:///{tmp}/shop.db"
        conn = sqlite3.connect(tmp / "shop.db")
        conn.execute("PRAGMA journal_mode=WAL")
        for start in range(0, args.rows, 1000):
            with conn:
                for n in range(start, min(start + 1000, args.rows)):
                    app.outbox(conn).enqueue(noop, n)
        conn.close()
    else:
        import psycopg

        source = f"{PG}?options=-csearch_path%3Ddw_relay_src"
        with psycopg.connect(PG, autocommit=True) as admin:
            admin.execute("DROP SCHEMA IF EXISTS dw_relay_src CASCADE")
            admin.execute("CREATE SCHEMA dw_relay_src")
        with psycopg.connect(source) as pconn:
            for start in range(0, args.rows, 1000):
                with pconn.transaction():
                    for n in range(start, min(start + 1000, args.rows)):
                        app.outbox(pconn).enqueue(noop, n)

    async def relay_all() -> float:
        relay = Relay(app, source, batch=1000)
        t0 = time.perf_counter()
        while await relay.relay_once():
            pass
        took = time.perf_counter() - t0
        relay._close()
        await app.broker.close()
        return took

    took = asyncio.run(relay_all())
    print(
        f"relayed {args.rows:,} outbox rows ({args.source} -> {args.broker} broker) "
        f"in {took:.2f} s: {args.rows / took:,.0f} messages/s"
    )


if __name__ == "__main__":
    main()
