"""Acks that travel with a claim (_ack_with_claim): one statement settles a
worker's finished jobs and claims its next ones, the counters stay exact, and
an ack whose claim fails is not lost (its caller sees the error and retries)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psycopg
import pytest

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres.queries import Queries
from dumbwaiter.errors import BrokerError
from tests.conformance.conftest import msg
from tests.integration.postgres.test_counts import _counted, _sql, _stats

Make = Callable[..., PostgresBroker]


def _states(schema: str) -> dict[str, str]:
    rows = _sql(f'SELECT id::text, state FROM "{schema}".dw_jobs')
    return {str(i): str(s) for i, s in rows}


def _no_lone_acks(b: PostgresBroker) -> None:
    """Make an ack sent on its own fail: only an ack carried by a claim works."""
    q = Queries(b.schema)
    q.ack = b"SELECT 1/0"
    q.ack_claim_one, q.ack_claim_many = b.q.ack_claim_one, b.q.ack_claim_many
    b.q = q


async def test_an_ack_made_as_a_claim_starts_rides_with_it(make_broker: Make) -> None:
    b = make_broker()
    await b.open()
    await b.enqueue([msg(queue="q") for _ in range(6)])
    first = await b.fetch(["q"], 3, 30.0, 0)
    # a scheduled job come due is promoted by the same statement
    later = msg(queue="q")
    later.eta = time.time() + 3600
    await b.enqueue([later])
    _sql(f"UPDATE \"{b.schema}\".dw_jobs SET run_at = now() WHERE state = 'scheduled'")
    _no_lone_acks(b)
    # the settler and the fetch loop woken in the same turn, as in a worker
    _, second = await asyncio.gather(b.ack(first), b.fetch(["q"], 10, 30.0, 0))
    states = _states(b.schema)
    assert {states[d.id] for d in first} == {"succeeded"}
    assert len(second) == 4 and {states[d.id] for d in second} == {"running"}
    assert later.id in {d.id for d in second}
    assert await _stats(b) == _counted(b.schema)
    st = b._state()
    assert st.boarding == 0 and not st.acks_on_claim


async def test_an_ack_with_its_attempts_record_rides_and_keeps_it(make_broker: Make) -> None:
    """The worker sends every success with its record (when the attempt
    started and finished, and the value of a task that keeps results): such
    acks ride too, and each row keeps its record, a kept result for longer."""
    b = make_broker()
    await b.open()
    await b.enqueue([msg(queue="q") for _ in range(5)])
    first = await b.fetch(["q"], 3, 30.0, 0)
    for k, d in enumerate(first):
        d.result = b'{"started":1.5,"finished":2.5}' if k else b'{"value":7}'
    first[0].result_ttl = 10 * b.retention
    _no_lone_acks(b)
    _, second = await asyncio.gather(b.ack(first), b.fetch(["q"], 10, 30.0, 0))
    rows = _sql(
        f"SELECT id::text, state, result, coalesce(date_part('epoch', expires_at - now()), 0)"
        f' FROM "{b.schema}".dw_jobs'
    )
    got = {str(i): (s, r, float(str(left))) for i, s, r, left in rows}
    assert [got[d.id][:2] for d in first] == [("succeeded", d.result) for d in first]
    assert got[first[0].id][2] > 5 * b.retention  # kept as long as its task asked
    assert b.retention / 2 < got[first[1].id][2] <= b.retention
    assert len(second) == 2 and {got[d.id][0] for d in second} == {"running"}
    assert await _stats(b) == _counted(b.schema)


async def test_an_ack_with_no_claim_coming_goes_alone(make_broker: Make) -> None:
    b = make_broker()
    await b.open()
    await b.enqueue([msg(queue="q") for _ in range(2)])
    ds = await b.fetch(["q"], 2, 30.0, 0)
    await b.ack(ds)
    assert set(_states(b.schema).values()) == {"succeeded"}
    assert await _stats(b) == _counted(b.schema)


async def test_an_ack_on_a_failed_claim_fails_and_is_retried(make_broker: Make) -> None:
    b = make_broker()
    await b.open()
    await b.enqueue([msg(queue="q") for _ in range(3)])
    ds = await b.fetch(["q"], 3, 30.0, 0)
    good = b.q
    bad = Queries(b.schema)
    bad.ack_claim_one = b"SELECT 1/0"
    b.q = bad
    acked, fetched = await asyncio.gather(
        b.ack(ds), b.fetch(["q"], 3, 30.0, 0), return_exceptions=True
    )
    # the seam's error, the server's as its cause
    assert isinstance(acked, BrokerError)
    assert isinstance(acked.__cause__, psycopg.errors.DivisionByZero)
    assert isinstance(fetched, BrokerError)
    assert isinstance(fetched.__cause__, psycopg.errors.DivisionByZero)
    assert set(_states(b.schema).values()) == {"running"}  # nothing half done
    b.q = good
    await b.ack(ds)  # the settler's retry
    assert set(_states(b.schema).values()) == {"succeeded"}
    assert await _stats(b) == _counted(b.schema)


@pytest.mark.parametrize("many", [False, True])
async def test_rides_under_concurrent_workers_keep_counts_exact(
    make_broker: Make, many: bool
) -> None:
    brokers = [make_broker() for _ in range(3)]
    queues = ["a", "b"] if many else ["a"]
    await brokers[0].enqueue([msg(queue=queues[k % len(queues)]) for k in range(90)])

    async def work(b: PostgresBroker) -> None:
        ds = await b.fetch(queues, 4, 30.0, 0)
        while ds:
            _, ds = await asyncio.gather(b.ack(ds), b.fetch(queues, 4, 30.0, 0))

    await asyncio.gather(*(work(b) for b in brokers))
    assert set(_states(brokers[0].schema).values()) == {"succeeded"}
    assert await _stats(brokers[0]) == _counted(brokers[0].schema)
