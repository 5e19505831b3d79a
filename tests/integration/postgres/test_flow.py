"""Flow control on PostgreSQL: the SQL functions keep flow.window_wait's rule
exactly, hold under concurrent takers on many connections, and are pruned."""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Callable

import psycopg

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.flow import window_wait
from tests.integration.postgres import server

Make = Callable[..., PostgresBroker]


def _sql(query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        cur = conn.execute(query.encode())
        return cur.fetchall() if cur.description else []


async def test_rate_take_gives_what_window_wait_gives_step_for_step(make_broker: Make) -> None:
    """Random start times, in and out of order, ties included: the function
    in the database answers exactly what the shared Python rule answers."""
    broker = make_broker()
    rnd = random.Random(20260)
    base = 1_000_000.0
    for case in range(6):
        rate, per = rnd.choice([(1, 1.0), (2, 0.5), (3, 1.0), (5, 2.0), (10, 1.0)])
        key = f"case-{case}"
        log: list[float] = []
        for _ in range(60):
            at = base + rnd.choice([rnd.uniform(0, 6), round(rnd.uniform(0, 6), 1)])
            while log and log[0] <= at - 2 * per:  # what every broker forgets
                log.pop(0)
            expected = window_wait(log, at, rate, per)
            assert await broker.rate_limit(key, rate, per, at) == expected, (case, at, log)
            if expected == 0.0:
                bisect.insort(log, at)
        base += 100


async def test_concurrent_takers_on_many_connections_never_share_a_slot(make_broker: Make) -> None:
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    takes = [
        b.slot_acquire("tenant:a", 3, f"job-{i}-{j}", 60.0)
        for i, b in enumerate(brokers)
        for j in range(10)
    ]
    got = await asyncio.gather(*takes)
    assert sum(got) == 3


async def test_concurrent_takers_of_a_new_rate_key_give_exactly_the_rate(
    make_broker: Make,
) -> None:
    """The first takes of a key race to make its row: still one at a time."""
    brokers = [make_broker() for _ in range(4)]
    for b in brokers:
        await b.open()
    now = time.time()
    waits = await asyncio.gather(
        *(b.rate_limit("fresh", 7, 60.0, now + j / 1000) for b in brokers for j in range(10))
    )
    assert sum(1 for w in waits if w == 0.0) == 7


async def test_maintenance_prunes_old_permits_and_expired_holds(make_broker: Make) -> None:
    broker = make_broker()
    now = time.time()
    assert await broker.rate_limit("old", 5, 1.0, now - 3600) == 0.0
    assert await broker.rate_limit("live", 5, 60.0, now) == 0.0
    assert await broker.slot_acquire("gone", 1, "crashed", 0.01)
    assert await broker.slot_acquire("kept", 1, "alive", 60.0)
    s = f'"{broker.schema}"'
    _sql(f"UPDATE {s}.dw_slots SET expires = now() - interval '1 hour' WHERE holder = 'crashed'")
    assert await broker.maintain()
    assert await broker.maintain()  # the key of a hold pruned by the first round
    assert _sql(f"SELECT key FROM {s}.dw_rate_keys") == [("live",)]
    assert _sql(f"SELECT key FROM {s}.dw_rate") == [("live",)]
    assert _sql(f"SELECT key, holder FROM {s}.dw_slots") == [("kept", "alive")]
    assert _sql(f"SELECT key FROM {s}.dw_slot_keys") == [("kept",)]
    # a pruned key is made again by its next take
    assert await broker.slot_acquire("gone", 1, "next", 60.0)
    assert await broker.rate_limit("old", 5, 1.0, now) == 0.0
