"""How long ``stats`` takes on the PostgreSQL broker with many stored jobs.

    PYTHONPATH=. flock /tmp/dw-bench.lock .venv/bin/python benchmarks/postgres_stats.py
        [--rows 300000] [--dsn postgresql://postgres@127.0.0.1:5432/test]

Bulk-enqueues ``--rows`` jobs into a fresh schema, marks all but 1,000 of them
succeeded (one UPDATE, as a worker's acks would over time), VACUUM ANALYZE,
then times ten ``stats`` calls and prints the median.  Run it on a tree
before migration 0004 (``git archive <commit> src``, first on PYTHONPATH) to
compare with the counting ``GROUP BY`` that ``stats`` was.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time

import psycopg

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.message import TASK, Message, uuid7


async def main(dsn: str, rows: int) -> None:
    schema = f"dw_stats_bench_{secrets.token_hex(3)}"
    broker = PostgresBroker(f"{dsn}?schema={schema}&migrate=auto")
    now = time.time()
    try:
        await broker.enqueue(
            Message(id=uuid7(), kind=TASK, name="noop", queue="default", args=[i], created_at=now)
            for i in range(rows)
        )
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                f"UPDATE \"{schema}\".dw_jobs SET state = 'succeeded',"  # type: ignore[arg-type]
                " expires_at = now() + interval '1 hour'"
                f' WHERE id IN (SELECT id FROM "{schema}".dw_jobs LIMIT {rows - 1000})'
            )
            c.execute(f'VACUUM ANALYZE "{schema}".dw_jobs')  # type: ignore[arg-type]
        await broker.stats()
        times = []
        for _ in range(10):
            t = time.perf_counter()
            [s] = await broker.stats()
            times.append(time.perf_counter() - t)
        print(
            f"{rows} jobs ({s.ready} ready, {s.succeeded} succeeded):"
            f" stats median {statistics.median(times) * 1000:.2f} ms"
        )
    finally:
        await broker.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    asyncio.run(main(args.dsn, args.rows))
