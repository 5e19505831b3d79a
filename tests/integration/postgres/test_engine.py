"""What only the PostgreSQL broker does: SKIP LOCKED, NOTIFY, COPY, pruning, leaders."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres import enqueue as enqueue_module
from dumbwaiter.brokers.postgres.broker import COPY_MIN, MAINTENANCE_LOCK
from dumbwaiter.brokers.postgres.options import parse_url
from dumbwaiter.errors import BrokerError, InvalidURL, PayloadTooLarge
from dumbwaiter.message import Message, encode
from dumbwaiter.state import State
from tests.conformance.conftest import msg
from tests.conformance.helpers import eventually, fetch_all, until_fetch_waits
from tests.integration.postgres import server
from tests.integration.postgres.test_handoff import _count_claims

Make = Callable[..., PostgresBroker]


def _sql(query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params or None)
        return cur.fetchall() if cur.description else []


# -- URLs ------------------------------------------------------------------------


def test_url_options_are_ours_and_the_rest_goes_to_libpq() -> None:
    opts = parse_url(
        "postgres://u:secret@db:6432/app?schema=jobs&pool_max=4&sync_pool_max=3"
        "&retention=60&migrate=auto&sslmode=disable&prepare_threshold=none"
    )
    assert (opts.schema, opts.pool_max, opts.sync_pool_max) == ("jobs", 4, 3)
    assert (opts.retention, opts.migrate, opts.prepare_threshold) == (60.0, "auto", None)
    assert opts.conninfo.startswith("postgresql://u:secret@db:6432/app?")
    assert "sslmode=disable" in opts.conninfo and "application_name=dumbwaiter" in opts.conninfo
    assert "schema=" not in opts.conninfo


@pytest.mark.parametrize(
    "query", ["pool_max=lots", "migrate=sometimes", "pool_max=1", "retention=soon"]
)
def test_bad_url_options_are_refused(query: str) -> None:
    with pytest.raises(InvalidURL):
        parse_url(f"postgresql://u:secret@db/app?{query}")


# -- SKIP LOCKED -------------------------------------------------------------------


async def test_a_claim_skips_rows_locked_by_another_transaction(make_broker: Make) -> None:
    """A slow claimer holding rows never makes another wait: it takes the next ones."""
    broker = make_broker()
    ms = [msg(args=[i]) for i in range(6)]
    for m in ms:
        await broker.enqueue([m])
    schema = broker.schema
    with psycopg.connect(server.SERVER) as slow:  # a transaction left open on purpose
        slow.execute(
            f'SELECT id FROM "{schema}".dw_jobs WHERE state = %s'
            " ORDER BY run_at LIMIT 2 FOR UPDATE",
            ("ready",),
        )
        got = await asyncio.wait_for(broker.fetch(["default"], 10, 30.0, 0), 5)
        assert [d.message.args[0] for d in got if d.message] == [2, 3, 4, 5]
        slow.rollback()
    rest = await broker.fetch(["default"], 10, 30.0, 0)
    assert [d.message.args[0] for d in rest if d.message] == [0, 1]


async def test_concurrent_fetchers_on_separate_connections_never_share_a_job(
    make_broker: Make,
) -> None:
    producer = make_broker()
    consumers = [make_broker() for _ in range(6)]
    n = 3000
    done = asyncio.Event()

    async def produce() -> None:
        for k in range(0, n, 250):  # while the consumers are already claiming
            await producer.enqueue([msg(args=[i]) for i in range(k, k + 250)])
        done.set()

    async def consume(b: PostgresBroker) -> list[str]:
        got: list[str] = []
        while True:
            ds = await b.fetch(["default"], 17, 30.0, 0.2)
            got += [d.id for d in ds]
            if not ds and done.is_set():
                return got

    results = await asyncio.gather(produce(), *(consume(b) for b in consumers))
    every = [i for r in results[1:] if r for i in r]
    assert len(every) == len(set(every)) == n
    assert sum(1 for r in results[1:] if r) > 1  # the work was actually shared


# -- LISTEN / NOTIFY ---------------------------------------------------------------


async def test_notify_is_sent_at_commit_of_the_callers_transaction(make_broker: Make) -> None:
    """enqueue_in (the same-database outbox): invisible and silent until commit."""
    consumer, producer = make_broker(), make_broker()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0))
    m = msg()
    async with await psycopg.AsyncConnection.connect(producer.opts.conninfo) as conn:
        await producer.aenqueue_in(conn, [m])
        await asyncio.sleep(0.2)  # time for a wrongly early wake-up to happen
        assert not waiting.done()
        await conn.commit()
    [d] = await asyncio.wait_for(waiting, 10)
    assert d.id == m.id


async def test_rolled_back_enqueue_leaves_nothing(make_broker: Make) -> None:
    broker = make_broker()
    await broker.open()
    with psycopg.connect(broker.opts.conninfo) as conn:
        broker.enqueue_in(conn, [msg(), msg()])
        conn.rollback()
    assert await broker.fetch(["default"], 10, 30.0, 0) == []


async def test_idle_fetch_waits_on_listen_not_on_polls(make_broker: Make) -> None:
    """With a poll interval far longer than the test, only NOTIFY can wake it."""
    consumer, producer = make_broker(poll_interval=3600), make_broker()
    await producer.open()
    waiting = asyncio.create_task(consumer.fetch(["default", "other"], 10, 30.0, 60.0))
    await until_fetch_waits(consumer, "other")  # LISTENing, its claim found nothing
    m = msg(queue="other")
    await producer.enqueue([m])
    [d] = await asyncio.wait_for(waiting, 10)
    assert d.id == m.id


async def test_fetch_polls_while_listen_is_down(make_broker: Make) -> None:
    consumer, producer = make_broker(poll_interval=0.05), make_broker()
    await consumer.fetch(["default"], 1, 30.0, 0.01)  # LISTEN is up
    listener = consumer._state().listener

    async def refused() -> psycopg.AsyncConnection[Any]:
        raise OSError("the LISTEN connection cannot be made (this test)")

    # as if the LISTEN connection were lost for good: the next fetch starts
    # the listener again, and its connection fails every time
    listener._connect = refused
    await listener.close()
    listener.listening = False
    m = msg()
    claims = _count_claims(consumer)
    waiting = asyncio.create_task(consumer.fetch(["default"], 10, 30.0, 60.0))
    # it claimed, found nothing, and claimed again: it polls (nothing else wakes it)
    await eventually(lambda: asyncio.sleep(0, claims[0]), lambda n: n >= 2)
    assert not waiting.done()
    await producer.enqueue([m])
    [d] = await asyncio.wait_for(waiting, 10)
    assert d.id == m.id
    assert not listener.listening  # it was a poll that found it


# -- bulk (COPY) --------------------------------------------------------------------


def _bulk(n: int, **kw: object) -> list[Message]:
    return [msg(args=[i], **kw) for i in range(n)]  # type: ignore[arg-type]


async def test_bulk_is_stored_in_order_with_every_id(make_broker: Make) -> None:
    broker = make_broker()
    ms = _bulk(3 * COPY_MIN)
    assert broker.enqueue_sync(iter(ms)) == [m.id for m in ms]
    ms2 = _bulk(2 * COPY_MIN)
    assert await broker.enqueue(iter(ms2)) == [m.id for m in ms2]
    got = await fetch_all(broker)
    assert [d.id for d in got] == [m.id for m in ms + ms2]  # FIFO across both paths


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_bulk_with_stored_ids_and_held_keys_keeps_the_stored_ones(
    make_broker: Make, path: str
) -> None:
    broker = make_broker()
    old, held = msg(), msg(key="k:1")
    await broker.enqueue([old, held])
    batch = [*_bulk(COPY_MIN), old, msg(key="k:1"), *_bulk(COPY_MIN)]
    if path == "sync":
        ids = broker.enqueue_sync(iter(batch))
    else:
        ids = await broker.enqueue(iter(batch))
    expected = [m.id for m in batch]
    expected[COPY_MIN + 1] = held.id  # the key's holder
    assert ids == expected
    assert len(await fetch_all(broker)) == 2 + 2 * COPY_MIN


async def test_bulk_mixes_ready_and_scheduled_jobs(make_broker: Make) -> None:
    broker = make_broker()
    later = time.time() + 3600
    batch = [msg(args=[i], eta=later if i % 10 == 0 else None) for i in range(2 * COPY_MIN)]
    assert broker.enqueue_sync(batch) == [m.id for m in batch]
    [stats] = await broker.stats()
    assert (stats.ready, stats.scheduled) == (2 * COPY_MIN - 13, 13)


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_bulk_that_fails_midway_stores_nothing(make_broker: Make, path: str) -> None:
    broker = make_broker()

    def batch() -> Iterator[Message]:
        yield from _bulk(3 * COPY_MIN)
        raise RuntimeError("the producer's generator broke")

    big = msg(args=["x" * 2_000_000])
    for bad, error in ((batch(), RuntimeError), ([*_bulk(2 * COPY_MIN), big], PayloadTooLarge)):
        with pytest.raises(error):
            if path == "sync":
                broker.enqueue_sync(bad)
            else:
                await broker.enqueue(bad)
    assert await broker.stats() == [] or (await broker.stats())[0].ready == 0


def _stored(broker: PostgresBroker, ids: list[str]) -> list[tuple[object, ...]]:
    rows = _sql(
        f"SELECT id::text, queue, name, kind, priority, max_attempts, key, body, state"
        f' FROM "{broker.schema}".dw_jobs WHERE id = ANY(%s::uuid[])',
        ids,
    )
    by_id = {r[0]: r for r in rows}
    return [by_id[i] for i in ids]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_bulk_stores_every_column_as_given(make_broker: Make, path: str) -> None:
    # several COPY chunks (bodies of ~3 KB), non-ASCII text, keys and
    # priorities that vary from row to row: each stored as the insert would
    broker = make_broker()
    batch = [
        msg(
            name=f"t.jöb{i % 3}",
            queue=("default", "façade", "q-ü")[i % 3],
            args=["é" * 1500, i],
            priority=(-2_147_483_648, 0, 7, 2_147_483_647)[i % 4],
            max_attempts=1 + i % 5,
            key=f"k:ß:{i}" if i % 4 == 1 else None,
        )
        for i in range(3 * COPY_MIN)
    ]
    if path == "sync":
        ids = broker.enqueue_sync(iter(batch))
    else:
        ids = await broker.enqueue(iter(batch))
    assert ids == [m.id for m in batch]
    expected = [
        (m.id, m.queue, m.name, "task", m.priority, m.max_attempts, m.key, encode(m), "ready")
        for m in batch
    ]
    assert _stored(broker, ids) == expected


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_one_job_at_a_time_stores_every_column_as_given_and_an_id_once(
    make_broker: Make, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a ready job alone takes queries.enqueue_ready (positional parameters,
    # the columns' defaults) once its queue has no idle worker to offer it
    # to; a job with an eta the general statement
    monkeypatch.setattr(enqueue_module, "HAND_BACKOFF", 3600.0)
    broker = make_broker()
    for q in ("façade", "q-ü", "default"):  # offered, no waiter: no offers for an hour
        await broker.enqueue([msg(queue=q)])
    later = time.time() + 3600
    ms = [
        msg(name="t.jöb", queue="façade", args=["é", 1], priority=-7, max_attempts=4),
        msg(queue="q-ü", priority=2_147_483_647, max_attempts=1, key="k:ß:1"),
        msg(priority=3, eta=later),
    ]
    ids = []
    for m in ms:
        if path == "sync":
            ids += broker.enqueue_sync([m])
            assert broker.enqueue_sync([m]) == [m.id]  # stored already: not again
        else:
            ids += await broker.enqueue([m])
            assert await broker.enqueue([m]) == [m.id]
    assert ids == [m.id for m in ms]
    expected = [
        (m.id, m.queue, m.name, "task", m.priority, m.max_attempts, m.key, encode(m), state)
        for m, state in zip(ms, ("ready", "ready", "scheduled"), strict=True)
    ]
    assert _stored(broker, ids) == expected
    rows = _sql(
        f"SELECT msg_key, run_at <= now(), run_at > now() + interval '59 minutes'"
        f' FROM "{broker.schema}".dw_jobs WHERE id = ANY(%s::uuid[]) ORDER BY id',
        ids,
    )
    assert rows == [(None, True, False), ("k:ß:1", True, False), (None, False, True)]
    assert sum(s.ready for s in await broker.stats()) == 3 + 2


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_bulk_with_a_priority_beyond_int4_stores_nothing(
    make_broker: Make, path: str
) -> None:
    broker = make_broker()
    batch = [*_bulk(COPY_MIN), msg(priority=2**31), *_bulk(COPY_MIN)]
    with pytest.raises(BrokerError) as caught:  # the seam's error, psycopg's as its cause
        if path == "sync":
            broker.enqueue_sync(batch)
        else:
            await broker.enqueue(batch)
    assert isinstance(caught.value.__cause__, psycopg.DataError)
    assert await broker.stats() == [] or (await broker.stats())[0].ready == 0


# -- retention and pruning -----------------------------------------------------------


async def test_pruning_keeps_the_table_to_live_jobs_and_the_retention(make_broker: Make) -> None:
    broker = make_broker(retention=0.2, prune_interval=0.05)
    keep = make_broker(retention=3600)
    await broker.enqueue(_bulk(200))
    ds = await fetch_all(broker)
    await broker.ack(ds[:150])  # 150 succeeded (expire soon), 50 running
    await keep.enqueue([long := msg()])
    [d] = await keep.fetch(["default"], 1, 30.0, 0)
    await keep.ack([d])  # succeeded, kept for an hour
    await keep.kv_set({"gone": b"1"}, ttl=0.1)
    await asyncio.sleep(0.3)  # the 150 expire (time itself must pass here)
    assert await broker.maintain()
    table = f'"{broker.schema}".dw_jobs'
    rows = _sql(f"SELECT state, count(*) FROM {table} GROUP BY state ORDER BY state")
    assert rows == [("running", 50), ("succeeded", 1)]
    assert (await keep.get(long.id)) is not None
    assert _sql(f'SELECT count(*) FROM "{broker.schema}".dw_kv') == [(0,)]


async def test_claims_read_the_ready_index_however_many_rows_are_finished(
    make_broker: Make,
) -> None:
    broker = make_broker()
    broker.migrate()
    schema = broker.schema
    # 20,000 finished rows, written directly (fast), then a few ready jobs
    _sql(
        f'INSERT INTO "{schema}".dw_jobs (id, queue, name, kind, state, max_attempts, body,'
        " expires_at) SELECT gen_random_uuid(), 'default', 't', 'task', 'succeeded', 1,"
        " '\\x7b7d', now() + interval '1 hour' FROM generate_series(1, 20000)"
    )
    _sql(f'ANALYZE "{schema}".dw_jobs')
    await broker.enqueue(_bulk(5))
    plan = "\n".join(
        str(r[0])
        for r in _sql(
            f"EXPLAIN SELECT id FROM \"{schema}\".dw_jobs WHERE state = 'ready'"
            " AND queue = 'default' ORDER BY priority DESC, run_at, id LIMIT 10"
            " FOR UPDATE SKIP LOCKED"
        )
    )
    assert "dw_jobs_ready" in plan, plan
    assert len(await broker.fetch(["default"], 10, 30.0, 0)) == 5


# -- maintenance leader -------------------------------------------------------------


async def test_one_maintenance_leader_and_a_successor_when_it_stops(make_broker: Make) -> None:
    a, b = make_broker(prune_interval=0.1), make_broker(prune_interval=0.1)
    assert await a.maintain()
    assert not await b.maintain()  # a leads; b only rescues
    assert await a.maintain()  # a leader keeps its lease by maintaining
    # a stops (killed): its lease (3 x prune_interval) runs out and b takes over
    assert await eventually(b.maintain, lambda led: led, timeout=10)
    assert not await a.maintain()


async def test_rescue_runs_maintenance_only_every_prune_interval(make_broker: Make) -> None:
    broker = make_broker(prune_interval=3600)
    await broker.rescue()
    await broker.rescue()
    rows = _sql(f'SELECT owner FROM "{broker.schema}".dw_locks WHERE name = %s', MAINTENANCE_LOCK)
    assert len(rows) == 1  # taken once, by the first rescue


async def test_a_job_rescued_by_one_broker_comes_back_to_another(make_broker: Make) -> None:
    a, b = make_broker(), make_broker()
    await a.enqueue([m := msg()])
    await a.fetch(["default"], 1, 0.1, 0, "w-a")
    assert await eventually(b.rescue, lambda n: n == 1)
    [d] = await b.fetch(["default"], 1, 30.0, 0, "w-b")
    assert d.id == m.id and d.message is not None and d.message.attempt == 2
    info = await b.get(m.id)
    assert info is not None and info.state is State.RUNNING and info.worker == "w-b"
