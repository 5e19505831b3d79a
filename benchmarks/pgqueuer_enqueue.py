"""pgqueuer's one-at-a-time enqueue, as the peers harness makes it, for
``postgres_producer.py``'s ``pgqueuer`` variant (run by it in the peers venv,
which has asyncpg and pgqueuer; the project's venv has neither).

The harness' adapter (peers/adapters/pgqueuer_adapter.py): one asyncpg
connection, ``Queries(AsyncpgDriver(conn)).enqueue(task, payload)`` awaited
one at a time on ``asyncio.run``'s loop.  Here the tables live in the schema
named by ``PGQUEUER_SCHEMA`` (``pgq install`` made them there).  Each line
on stdin runs one batch of ``n`` enqueues and answers with one JSON line:
the rate and this thread's CPU per call (microseconds); ``quit`` ends.

    PGQUEUER_SCHEMA=s /tmp/peers-venv/bin/python benchmarks/pgqueuer_enqueue.py DSN N
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def serve(dsn: str, n: int) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn)
    q = Queries(AsyncpgDriver(conn))
    try:
        for line in sys.stdin:  # nothing else runs on this loop meanwhile
            if line.strip() == "quit":
                break
            cpu, t = time.thread_time(), time.perf_counter()
            for i in range(n):
                await q.enqueue("noop", str(i).encode())
            wall = time.perf_counter() - t
            cpu_us = (time.thread_time() - cpu) / n * 1e6
            print(json.dumps({"rate": n / wall, "cpu_us": cpu_us}), flush=True)
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
