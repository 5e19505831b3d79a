"""The outbox on the PostgreSQL broker's own database: no outbox table, no relay.

The caller's transaction inserts the jobs (and the events' deliveries to
bound queues) itself: a rollback leaves nothing, a commit makes jobs a
worker runs at once, woken by the NOTIFY sent at that commit.  Connections
to another database, or of a role that may not write the broker's tables,
take the outbox table instead, and their probe never fails the caller's
transaction.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import dumbwaiter as dw
from dumbwaiter.brokers import from_url
from dumbwaiter.sqldb import adapt
from dumbwaiter.testing import drain
from tests.integration.postgres import server


class PaymentTaken(dw.Event, type="outbox.pg_payment_taken"):
    order_id: str


@pytest.fixture
def schema() -> Iterator[str]:
    name = server.new_schema()
    yield name
    server.drop([name])


@pytest.fixture
def app(schema: str) -> Iterator[dw.App]:
    a = dw.App(server.url(schema, poll_interval="3600"), retry=dw.Retry.never())
    asyncio.run(a.broker.open())  # makes the schema (?migrate=auto)
    yield a
    a.close()


def _in(schema: str) -> dict[str, Any]:
    """The application's connections put what they make in the test's schema
    (an outbox table, had one been made, would be there)."""
    return {"options": f"-csearch_path={schema}"}


def _outbox_tables(schema: str) -> list[Any]:
    with psycopg.connect(server.SERVER, autocommit=True) as c:
        return c.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = 'dw_outbox' AND n.nspname = %s",
            (schema,),
        ).fetchall()


def _get(app: dw.App, job_id: str) -> Any:
    return asyncio.run(app.broker.get(job_id))


def test_psycopg_rolled_back_leaves_nothing_committed_runs_without_a_relay(
    app: dw.App, schema: str
) -> None:
    ran: list[int] = []

    @app.task
    def send_welcome(user_id: int) -> None:
        ran.append(user_id)

    with psycopg.connect(server.SERVER, **_in(schema)) as conn:  # the application's own
        conn.execute(f'CREATE TABLE "{schema}".users (id int)')
        conn.commit()
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute(f'INSERT INTO "{schema}".users VALUES (1)')
            rolled_back = app.outbox(conn).enqueue(send_welcome, 1)
            raise RuntimeError("the request failed")
        with conn.transaction():
            conn.execute(f'INSERT INTO "{schema}".users VALUES (2)')
            committed = app.outbox(conn).enqueue(send_welcome, 2)
    assert _get(app, rolled_back.id) is None
    assert committed.status() == dw.State.READY  # a job already, no relay
    asyncio.run(drain(app))
    assert ran == [2]
    assert _outbox_tables(schema) == []


async def test_async_psycopg_commit_sends_the_notify_that_wakes_a_waiting_fetch(
    app: dw.App, schema: str
) -> None:
    @app.task
    async def ship(order: str) -> None: ...

    listen = await psycopg.AsyncConnection.connect(server.SERVER, autocommit=True)
    await listen.execute(f'LISTEN "dumbwaiter:{schema}"')
    other = from_url(app.url)
    # poll_interval=3600: only a NOTIFY can wake this fetch before the test's timeout
    waiting = asyncio.create_task(app.broker.fetch(["default"], 10, 30.0, 60.0))
    try:
        async with await psycopg.AsyncConnection.connect(server.SERVER, **_in(schema)) as conn:
            job = await app.outbox(conn).aenqueue(ship, "o-1")
            assert await other.fetch(["default"], 10, 30.0, 0) == []  # not before the commit
            assert not waiting.done()
            await conn.commit()
        notes = [n.payload async for n in listen.notifies(timeout=10, stop_after=1)]
        assert notes == ["default"]
        [d] = await asyncio.wait_for(waiting, 10)
        assert d.id == job.id
    finally:
        waiting.cancel()
        await listen.close()
        await other.close()


def test_events_fan_out_and_sqlalchemy_sessions_sync_and_async(app: dw.App, schema: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from sqlalchemy.orm import Session

    got: list[str] = []

    @app.task
    def note(n: int) -> None:
        got.append(f"task {n}")

    @app.subscribe(PaymentTaken, group="ledger")
    def ledger(event: PaymentTaken) -> None:
        got.append(f"event {event.order_id}")

    asyncio.run(app._declare())  # the group's queue is bound to the event type
    sa_url = server.SERVER.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(sa_url, connect_args=_in(schema))
    with Session(engine) as session, session.begin():
        app.outbox(session).publish(PaymentTaken(order_id="s-1"))
        app.outbox(session).enqueue(note, 1)
    with engine.connect() as conn:  # no explicit begin: the outbox joins the autobegun one
        app.outbox(conn).enqueue(note, 2)
        conn.commit()
    with pytest.raises(RuntimeError), engine.begin() as conn:
        app.outbox(conn).publish(PaymentTaken(order_id="never"))
        app.outbox(conn).enqueue(note, 99)
        raise RuntimeError("rolled back")
    engine.dispose()

    async def with_async() -> None:
        aengine = create_async_engine(sa_url, connect_args=_in(schema))
        async with aengine.begin() as aconn:
            await app.outbox(aconn).apublish(PaymentTaken(order_id="a-1"))
        async with AsyncSession(aengine) as s, s.begin():
            await app.outbox(s).aenqueue(note, 3)
        with pytest.raises(RuntimeError):
            async with AsyncSession(aengine) as s, s.begin():
                await app.outbox(s).apublish(PaymentTaken(order_id="never-async"))
                raise RuntimeError("rolled back")
        await aengine.dispose()

    asyncio.run(with_async())
    asyncio.run(drain(app))
    assert sorted(got) == ["event a-1", "event s-1", "task 1", "task 2", "task 3"]
    logged, _ = asyncio.run(app.broker.list_events(PaymentTaken.event_type))
    assert len(logged) == 2  # the rolled-back events were never logged
    assert _outbox_tables(schema) == []


def test_autocommit_outside_a_transaction_is_refused(app: dw.App, schema: str) -> None:
    @app.task
    def t() -> None: ...

    with psycopg.connect(server.SERVER, autocommit=True, **_in(schema)) as conn:
        with pytest.raises(dw.ConfigurationError, match="needs a transaction"):
            app.outbox(conn).enqueue(t)
        with conn.transaction():
            app.outbox(conn).enqueue(t)


def test_another_database_or_a_role_without_rights_is_not_ours(app: dw.App, schema: str) -> None:
    other_db = server.SERVER.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(other_db) as conn:
        assert not app.broker.owns_connection_sync(adapt(conn))
        conn.rollback()
    role = f"dw_probe_{secrets.token_hex(4)}"
    with psycopg.connect(server.SERVER, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    try:
        as_role = server.SERVER.replace("://postgres@", f"://{role}@", 1)
        with psycopg.connect(as_role) as conn:
            assert not app.broker.owns_connection_sync(adapt(conn))
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the transaction is intact
            conn.rollback()
        with psycopg.connect(server.SERVER) as conn:  # the same database, all rights
            assert app.broker.owns_connection_sync(adapt(conn))
            conn.rollback()
    finally:
        with psycopg.connect(server.SERVER, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")


def test_the_callers_search_path_does_not_matter(app: dw.App) -> None:
    """Statements and triggers name the broker's schema; the caller's
    search_path here has none of it (nor a schema to make an outbox table in)."""

    @app.task
    def t(n: int) -> None: ...

    with psycopg.connect(server.SERVER, options="-csearch_path=pg_catalog") as conn:
        with conn.transaction():
            job = app.outbox(conn).enqueue(t, 1)
    assert job.status() == dw.State.READY
    [s] = asyncio.run(app.broker.stats())  # counted by the triggers, in the broker's schema
    assert (s.queue, s.ready) == ("default", 1)
