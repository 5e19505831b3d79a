"""Counters behind ``stats`` (migration 0004): exact whoever changes the jobs,
under concurrent writers and folders, and from an upgrade of a filled schema."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres.migrations import migration_sql
from tests.conformance.conftest import msg
from tests.conformance.helpers import error
from tests.integration.postgres import server

Make = Callable[..., PostgresBroker]


def _sql(query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        cur = conn.execute(query.encode())
        return cur.fetchall() if cur.description else []


def _counted(schema: str) -> dict[tuple[str, str], int]:
    """What stats must say: a GROUP BY over every stored job."""
    rows = _sql(
        "SELECT queue, CASE WHEN state = 'scheduled' AND attempt > 0 THEN 'retrying'"
        f' ELSE state END, count(*) FROM "{schema}".dw_jobs GROUP BY 1, 2'
    )
    return {(str(q), str(s)): int(n) for q, s, n in rows}  # type: ignore[call-overload]


async def _stats(broker: PostgresBroker) -> dict[tuple[str, str], int]:
    out = {}
    for s in await broker.stats():
        for state in ("ready", "scheduled", "retrying", "running", "dead", "succeeded"):
            if getattr(s, state):
                out[(s.queue, state)] = getattr(s, state)
        if s.cancelled:
            out[(s.queue, "cancelled")] = s.cancelled
    return out


async def test_counts_follow_concurrent_workers_and_sql_run_by_hand(make_broker: Make) -> None:
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()

    async def work(b: PostgresBroker, i: int) -> None:
        for r in range(5):
            await b.enqueue([msg(queue=f"q{i % 2}", args=[r, k]) for k in range(7)])
            ds = await b.fetch([f"q{i % 2}"], 5, 30.0, 0)
            for d in ds[:1]:
                d.error, d.retry_at = error(), 0.0
            await b.retry(ds[:1])
            await b.ack(ds[1:3])
            for d in ds[3:4]:
                d.error = error()
            await b.dead(ds[3:4])
            await b.extend(ds[4:], 30.0)
            await b.stats()  # folds while the others write

    await asyncio.gather(*(work(b, i) for i, b in enumerate(brokers)))
    schema = brokers[0].schema
    assert await _stats(brokers[0]) == _counted(schema)
    s = f'"{schema}".dw_jobs'
    _sql(f"DELETE FROM {s} WHERE state = 'succeeded' AND queue = 'q0'")
    _sql(f"UPDATE {s} SET state = 'cancelled' WHERE state = 'ready' AND queue = 'q1'")
    assert await _stats(brokers[1]) == _counted(schema)
    assert await brokers[0].maintain()  # folds and drops counters at zero
    assert await _stats(brokers[2]) == _counted(schema)


async def test_an_upgrade_counts_the_jobs_already_stored(make_broker: Make, schema: str) -> None:
    with psycopg.connect(server.SERVER, autocommit=True) as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        for version in (1, 2, 3):
            conn.execute(migration_sql(version).encode())
        conn.execute(
            b"INSERT INTO dw_jobs (id, queue, name, kind, state, attempt, max_attempts, body)"
            b" SELECT gen_random_uuid(), 'old', 't', 'task', s, a, 4, '{}'"
            b" FROM (VALUES ('ready', 0), ('ready', 0), ('scheduled', 0), ('scheduled', 1),"
            b" ('dead', 4)) AS v(s, a)"
        )
    broker = make_broker()  # ?migrate=auto: 3 -> 4
    await broker.enqueue([msg(queue="old")])
    assert await _stats(broker) == {
        ("old", "ready"): 3,
        ("old", "scheduled"): 1,
        ("old", "retrying"): 1,
        ("old", "dead"): 1,
    }
