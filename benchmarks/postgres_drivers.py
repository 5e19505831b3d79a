"""A bare one-row INSERT per call (autocommit) with psycopg and with asyncpg,
alternated, on a plain table: whether pgqueuer's lead over the bare psycopg
anchor in the harness comes from its driver.

    flock /tmp/dw-bench.lock /tmp/peers-venv/bin/python benchmarks/postgres_drivers.py

asyncpg is not one of dumbwaiter's dependencies: run it in the peers' venv
(``../shared/bench/peers/setup.sh``), which has both.  Figures in
docs/benchmarks.md (issue 25, point 1 on PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg  # type: ignore[import-not-found, unused-ignore]
import psycopg

BODY = b"x" * 100


def setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS dw_drivers_probe")
        c.execute("CREATE TABLE dw_drivers_probe (id bigserial PRIMARY KEY, body bytea)")


def with_psycopg(dsn: str, n: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as c:
        began = time.perf_counter()
        for _ in range(n):
            c.execute("INSERT INTO dw_drivers_probe (body) VALUES (%s)", (BODY,))
        return n / (time.perf_counter() - began)


async def with_asyncpg(dsn: str, n: int) -> float:
    c = await asyncpg.connect(dsn)
    try:
        began = time.perf_counter()
        for _ in range(n):
            await c.execute("INSERT INTO dw_drivers_probe (body) VALUES ($1)", BODY)
        return n / (time.perf_counter() - began)
    finally:
        await c.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--pairs", type=int, default=4)
    a = p.parse_args()
    setup(a.dsn)
    ratios = []
    for _ in range(a.pairs):
        psy = with_psycopg(a.dsn, a.n)
        apg = asyncio.run(with_asyncpg(a.dsn, a.n))
        ratios.append(apg / psy)
        print(f"psycopg {psy:,.0f}/s  asyncpg {apg:,.0f}/s  asyncpg/psycopg {apg / psy:.2f}")
    print("asyncpg/psycopg per pair:", ", ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
