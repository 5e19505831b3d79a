"""The transactional outbox and the consumer inbox, against real databases.

A rolled-back transaction sends nothing; a committed one is delivered; the
relay moves committed rows in order and a re-sent row keeps its id; the
inbox makes a handler's effect happen once even when the message comes twice.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.relay import Relay
from dumbwaiter.testing import drain
from tests.integration.postgres.server import new_schema
from tests.integration.postgres.server import url as pg_url


class PaymentTaken(dw.Event, type="outbox.payment_taken"):
    order_id: str


@pytest.fixture
def app(tmp_path: Path) -> Iterator[dw.App]:
    a = dw.App(f"sqlite:///{tmp_path}/broker.db", retry=dw.Retry.never())
    yield a
    a.close()


def _counts(app: dw.App) -> dict[str, int]:
    stats = asyncio.run(app.broker.stats())
    return {s.queue: s.ready + s.succeeded for s in stats}


def test_same_sqlite_database_the_job_is_part_of_the_transaction(
    app: dw.App, tmp_path: Path
) -> None:
    @app.task
    def send_welcome(user_id: int) -> None: ...

    conn = sqlite3.connect(tmp_path / "broker.db")  # the application's own connection
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    with pytest.raises(RuntimeError):
        with conn:
            conn.execute("INSERT INTO users (id) VALUES (1)")
            app.outbox(conn).enqueue(send_welcome, 1)
            raise RuntimeError("the request failed")
    assert _counts(app).get("default", 0) == 0  # rolled back: nothing to run
    with conn:
        conn.execute("INSERT INTO users (id) VALUES (2)")
        job = app.outbox(conn).enqueue(send_welcome, 2)
    assert job.status() == dw.State.READY  # committed: a job, no relay needed
    assert not conn.execute("SELECT name FROM sqlite_master WHERE name='dw_outbox'").fetchall()
    conn.close()


def test_other_database_goes_through_the_relay_in_order(app: dw.App, tmp_path: Path) -> None:
    got: list[str] = []

    @app.task
    def step(n: int) -> None:
        got.append(f"task {n}")

    @app.subscribe(PaymentTaken, group="ledger")
    def ledger(event: PaymentTaken) -> None:
        got.append(f"event {event.order_id}")

    shop = tmp_path / "shop.db"
    conn = sqlite3.connect(shop)
    with conn:
        app.outbox(conn).enqueue(step, 1)
        app.outbox(conn).publish(PaymentTaken(order_id="o-1"))
        app.outbox(conn).enqueue(step, 2)
    with pytest.raises(RuntimeError):
        with conn:
            app.outbox(conn).enqueue(step, 99)
            raise RuntimeError("rolled back")
    asyncio.run(app._declare())
    relay = Relay(app, f"sqlite:///{shop}")
    assert asyncio.run(relay.relay_once()) == 3
    assert asyncio.run(relay.relay_once()) == 0  # marked relayed
    asyncio.run(drain(app, concurrency=1))
    assert sorted(got) == ["event o-1", "task 1", "task 2"]
    pending = conn.execute("SELECT count(*) FROM dw_outbox WHERE relayed_at IS NULL").fetchone()
    assert pending == (0,)
    conn.close()


def test_per_call_options_go_through_the_outbox_on_both_paths(app: dw.App, tmp_path: Path) -> None:
    """``app.outbox(conn).enqueue(task.options(...), ...)`` keeps the options:
    the queue, priority and eta a ``task.options(...).enqueue`` would store,
    whether the job is written in the caller's transaction or relayed."""

    @app.task
    def remind(user_id: int) -> None: ...

    later = time.time() + 3600
    same = sqlite3.connect(tmp_path / "broker.db")
    with same:
        direct = app.outbox(same).enqueue(remind.options(queue="mail", priority=7, eta=later), 1)
    shop = sqlite3.connect(tmp_path / "shop.db")
    with shop:
        relayed = app.outbox(shop).enqueue(remind.options(queue="mail", eta=later), 2)
    asyncio.run(app._declare())
    assert asyncio.run(Relay(app, f"sqlite:///{tmp_path / 'shop.db'}").relay_once()) == 1
    for job, priority in ((direct, 7), (relayed, 0)):
        info = asyncio.run(app.broker.get(job.id))
        assert info is not None
        assert (info.state, info.message.queue) == (dw.State.SCHEDULED, "mail")
        assert info.message.priority == priority
        assert info.message.eta == pytest.approx(later)
    same.close()
    shop.close()


def test_a_row_sent_twice_keeps_its_id_and_the_inbox_drops_the_copy(
    app: dw.App, tmp_path: Path
) -> None:
    effects: list[str] = []
    shop = tmp_path / "shop.db"

    @app.subscribe(PaymentTaken, group="billing")
    def bill(event: PaymentTaken, ctx: dw.Context) -> None:
        c = sqlite3.connect(shop)
        with c:
            if ctx.inbox(c):
                effects.append(event.order_id)
        c.close()

    conn = sqlite3.connect(shop)
    with conn:
        event_id = app.outbox(conn).publish(PaymentTaken(order_id="o-7"))
    asyncio.run(app._declare())
    relay = Relay(app, f"sqlite:///{shop}")
    # the relay sent the batch, then died before marking it: sent again
    rows = asyncio.run(relay._db(relay._read))
    asyncio.run(relay._send([dw.message.decode(b) for _, b in rows]))
    asyncio.run(relay.relay_once())
    asyncio.run(drain(app))
    assert effects == ["o-7"]
    logged, _ = asyncio.run(app.broker.list_events("outbox.payment_taken"))
    assert [e.id for e in logged] == [event_id]
    conn.close()


def test_inbox_makes_the_effect_exactly_once_across_a_crash(app: dw.App, tmp_path: Path) -> None:
    """The handler commits its effect and dies before the worker acks: the
    redelivery finds the mark and does nothing."""
    shop = tmp_path / "shop.db"
    setup = sqlite3.connect(shop)
    setup.execute("CREATE TABLE charges (order_id TEXT)")
    setup.commit()
    setup.close()
    crashed = {"once": False}

    @app.task(retry=dw.Retry(attempts=3, backoff=0.01))
    def charge(order_id: str, ctx: dw.Context) -> None:
        c = sqlite3.connect(shop)
        with c:
            if ctx.inbox(c):
                c.execute("INSERT INTO charges VALUES (?)", (order_id,))
        c.close()
        if not crashed["once"]:
            crashed["once"] = True
            raise ConnectionError("died after the commit, before the ack")

    charge.enqueue("o-1")
    asyncio.run(drain(app))
    c = sqlite3.connect(shop)
    assert c.execute("SELECT count(*) FROM charges").fetchone() == (1,)
    assert c.execute("SELECT count(*) FROM dw_inbox").fetchone() == (1,)
    c.close()


def test_sqlalchemy_sync_and_async_sessions(app: dw.App, tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.orm import Session

    @app.task
    def note(n: int) -> None: ...

    engine = create_engine(f"sqlite:///{tmp_path}/orm.db")
    with Session(engine) as session, session.begin():
        session.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
        app.outbox(session).enqueue(note, 1)
    with engine.begin() as conn:
        app.outbox(conn).enqueue(note, 2)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        app.outbox(conn).enqueue(note, 3)
        raise RuntimeError("rolled back")

    async def with_async() -> None:
        aengine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/orm.db")
        async with aengine.begin() as aconn:
            await app.outbox(aconn).aenqueue(note, 4)
        with pytest.raises(dw.ConfigurationError, match="async connection"):
            async with aengine.begin() as aconn:
                app.outbox(aconn).enqueue(note, 5)
        await aengine.dispose()

    asyncio.run(with_async())
    engine.dispose()
    relay = Relay(app, f"sqlite:///{tmp_path}/orm.db")
    assert asyncio.run(relay.relay_once()) == 3
    stats = asyncio.run(app.broker.stats())
    assert sum(s.ready for s in stats) == 3


def test_psycopg_sync_and_async_with_a_postgres_relay(app: dw.App) -> None:
    import psycopg

    schema = new_schema()
    base = pg_url(schema).split("?")[0].replace("postgres://", "postgresql://")
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    dsn = f"{base}?options=-csearch_path%3D{schema}"
    seen: list[Any] = []

    @app.task
    def ship(order: str) -> None:
        seen.append(order)

    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE orders (id TEXT)")
            app.outbox(conn).enqueue(ship, "p-1")
        with pytest.raises(RuntimeError), conn.transaction():
            app.outbox(conn).enqueue(ship, "p-2")
            raise RuntimeError("rolled back")

    async def with_async() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            async with aconn.transaction():
                await app.outbox(aconn).aenqueue(ship, "p-3")

    asyncio.run(with_async())
    relay = Relay(app, dsn)
    assert asyncio.run(relay.relay_once()) == 2
    asyncio.run(drain(app))
    assert sorted(seen) == ["p-1", "p-3"]
    relay._close()


def test_enqueue_returns_a_job_handle_that_knows_the_job_once_relayed(
    app: dw.App, tmp_path: Path
) -> None:
    """The handle is a ``Job`` as ``task.enqueue`` returns.  Before the relay
    moved its row the broker has no such job: ``status()`` raises
    ``JobNotFound`` and ``cancel()`` finds nothing; after it, the job is known."""

    @app.task(keep_result=True)
    def total(a: int, b: int) -> int:
        return a + b

    conn = sqlite3.connect(tmp_path / "shop.db")
    with conn:
        job = app.outbox(conn).enqueue(total, 2, 3)
        assert isinstance(job, dw.Job)
    with pytest.raises(dw.JobNotFound):
        job.status()  # committed, but still in the shop's dw_outbox
    assert job.cancel() is False  # nothing to cancel yet: the relay will move it
    with pytest.raises(dw.ResultTimeout, match="relay"):
        job.result(timeout=0.05)  # waits for the relay, then says why it gave up
    asyncio.run(app._declare())
    relay = Relay(app, f"sqlite:///{tmp_path}/shop.db")
    assert asyncio.run(relay.relay_once()) == 1
    assert job.status() == dw.State.READY
    assert app.job(job.id) == job
    asyncio.run(drain(app))
    assert job.result(timeout=5) == 5
    conn.close()


async def test_result_waits_for_the_relay_instead_of_raising_not_found(
    app: dw.App, tmp_path: Path
) -> None:
    @app.task(keep_result=True)
    async def double(n: int) -> int:
        return 2 * n

    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/shop.db")
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE orders (id INTEGER)"))
        job = await app.outbox(conn).aenqueue(double, 21)
    await engine.dispose()
    assert isinstance(job, dw.Job)
    waiting = asyncio.create_task(job.aresult(timeout=30))  # before the relay ran
    await asyncio.sleep(0)
    with pytest.raises(dw.JobNotFound):
        await job.astatus()
    assert not waiting.done()
    await app._declare()
    relay = Relay(app, f"sqlite:///{tmp_path}/shop.db")
    assert await relay.relay_once() == 1
    await drain(app)
    assert await waiting == 42
