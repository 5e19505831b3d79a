"""A rolled-back first write does not poison the connection.

The outbox table (``dw_outbox``) and the inbox table (``dw_inbox``) are made
in the caller's transaction the first time a connection needs them, so a
rollback takes the ``CREATE TABLE`` with it.  Every later write on that
connection must still work, and the committed jobs must reach the broker
through the relay.  The broker is PostgreSQL (a schema of the test database);
the source is another database on the same server (``postgres``, in a schema
of its own), or a SQLite file, so the outbox table is the path taken.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import dumbwaiter as dw
from dumbwaiter.inbox import mark, mark_sync
from dumbwaiter.relay import Relay
from dumbwaiter.sqldb import adapt
from dumbwaiter.testing import drain
from tests.integration.postgres import server


@pytest.fixture
def app() -> Iterator[dw.App]:
    schema = server.new_schema()
    a = dw.App(server.url(schema, poll_interval="3600"), retry=dw.Retry.never())
    asyncio.run(a.broker.open())
    yield a
    a.close()
    server.drop([schema])


def _other_database() -> str:
    """The test server's ``postgres`` database: not the broker's."""
    parts = urlsplit(server.SERVER)
    return urlunsplit(parts._replace(path="/postgres", query=""))


@pytest.fixture
def source() -> Iterator[tuple[str, str]]:
    """(database URL, schema): a fresh schema in another database than the broker's."""
    base = _other_database()
    schema = f"dwsrc_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
    yield base, schema
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _relay_and_run(app: dw.App, relay_url: str) -> list[str]:
    """Relay every committed row, run the jobs; the orders that ran."""
    relay = Relay(app, relay_url)
    try:
        asyncio.run(relay.relay_once())
    finally:
        relay._close()
    asyncio.run(drain(app))
    return sorted(app.ran)  # type: ignore[attr-defined]


def _ship_task(app: dw.App) -> dw.Task:
    app.ran = []  # type: ignore[attr-defined]

    @app.task
    def ship(order: str) -> None:
        app.ran.append(order)  # type: ignore[attr-defined]

    return ship


def _sync_scenario(
    app: dw.App, ship: dw.Task, txn: Callable[[], AbstractContextManager[Any]], conn: Any
) -> None:
    """Rolled back (first write on the connection), then two committed
    transactions, each with two writes."""
    with pytest.raises(RuntimeError, match="the request failed"), txn():
        app.outbox(conn).enqueue(ship, "rolled-back-1")
        app.outbox(conn).enqueue(ship, "rolled-back-2")
        raise RuntimeError("the request failed")
    for n in (1, 2):
        with txn():
            app.outbox(conn).enqueue(ship, f"committed-{n}a")
            app.outbox(conn).enqueue(ship, f"committed-{n}b")


async def _async_scenario(
    app: dw.App, ship: dw.Task, txn: Callable[[], AbstractAsyncContextManager[Any]], conn: Any
) -> None:
    with pytest.raises(RuntimeError, match="the request failed"):
        async with txn():
            await app.outbox(conn).aenqueue(ship, "rolled-back-1")
            await app.outbox(conn).aenqueue(ship, "rolled-back-2")
            raise RuntimeError("the request failed")
    for n in (1, 2):
        async with txn():
            await app.outbox(conn).aenqueue(ship, f"committed-{n}a")
            await app.outbox(conn).aenqueue(ship, f"committed-{n}b")


COMMITTED = ["committed-1a", "committed-1b", "committed-2a", "committed-2b"]


def _dsn(source: tuple[str, str]) -> str:
    base, schema = source
    return f"{base}?options=-csearch_path%3D{schema}"


def test_psycopg_sync(app: dw.App, source: tuple[str, str]) -> None:
    ship = _ship_task(app)
    with psycopg.connect(_dsn(source)) as conn:
        conn.execute("CREATE TABLE orders (id TEXT)")
        conn.commit()
        _sync_scenario(app, ship, conn.transaction, conn)
    assert _relay_and_run(app, _dsn(source)) == COMMITTED


def test_psycopg_sync_commit_and_rollback_by_hand(app: dw.App, source: tuple[str, str]) -> None:
    """The same without ``conn.transaction()``: the write opens the
    transaction, ``rollback()`` and ``commit()`` end it."""
    ship = _ship_task(app)
    with psycopg.connect(_dsn(source)) as conn:
        conn.execute("CREATE TABLE orders (id TEXT)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES ('o-1')")
        app.outbox(conn).enqueue(ship, "rolled-back")
        conn.rollback()
        app.outbox(conn).enqueue(ship, "committed")
        conn.commit()
    assert _relay_and_run(app, _dsn(source)) == ["committed"]


def test_psycopg_async(app: dw.App, source: tuple[str, str]) -> None:
    ship = _ship_task(app)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(_dsn(source)) as conn:
            await _async_scenario(app, ship, conn.transaction, conn)

    asyncio.run(main())
    assert _relay_and_run(app, _dsn(source)) == COMMITTED


def _sa_url(source: tuple[str, str], driver: str = "psycopg") -> tuple[str, dict[str, Any]]:
    base, schema = source
    return base.replace("postgresql://", f"postgresql+{driver}://", 1), {
        "options": f"-csearch_path={schema}"
    }


@pytest.mark.parametrize("shape", ["Connection", "Session"])
def test_sqlalchemy_sync(app: dw.App, source: tuple[str, str], shape: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    ship = _ship_task(app)
    url, args = _sa_url(source)
    engine = create_engine(url, connect_args=args)
    try:
        if shape == "Connection":
            with engine.connect() as conn:
                _sync_scenario(app, ship, conn.begin, conn)
        else:
            with Session(engine) as session:
                _sync_scenario(app, ship, session.begin, session)
    finally:
        engine.dispose()
    assert _relay_and_run(app, _dsn(source)) == COMMITTED


@pytest.mark.parametrize("shape", ["AsyncConnection", "AsyncSession"])
def test_sqlalchemy_async(app: dw.App, source: tuple[str, str], shape: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    ship = _ship_task(app)
    url, args = _sa_url(source)

    async def main() -> None:
        engine = create_async_engine(url, connect_args=args)
        try:
            if shape == "AsyncConnection":
                async with engine.connect() as conn:
                    await _async_scenario(app, ship, conn.begin, conn)
            else:
                async with AsyncSession(engine) as session:
                    await _async_scenario(app, ship, session.begin, session)
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert _relay_and_run(app, _dsn(source)) == COMMITTED


def test_sqlite_source(app: dw.App, tmp_path: Path) -> None:
    """sqlite3 runs the CREATE TABLE inside the transaction the caller's own
    INSERT opened: the rollback takes it too."""
    ship = _ship_task(app)
    path = tmp_path / "shop.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE orders (id TEXT)")
    conn.commit()

    @contextmanager
    def txn() -> Iterator[None]:
        with conn:
            conn.execute("INSERT INTO orders VALUES ('o')")
            yield

    _sync_scenario(app, ship, txn, conn)
    conn.close()
    assert _relay_and_run(app, f"sqlite:///{path}") == COMMITTED


def test_sqlalchemy_sqlite_source(app: dw.App, tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    ship = _ship_task(app)
    path = tmp_path / "orm.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE orders (id TEXT)"))
    with engine.connect() as conn:

        @contextmanager
        def txn() -> Iterator[None]:
            with conn.begin():
                conn.execute(text("INSERT INTO orders VALUES ('o')"))
                yield

        _sync_scenario(app, ship, txn, conn)
    engine.dispose()
    assert _relay_and_run(app, f"sqlite:///{path}") == COMMITTED


# -- the inbox: its table is made the same way --------------------------------------


def test_inbox_psycopg_sync_after_a_rolled_back_first_mark(source: tuple[str, str]) -> None:
    """A handler's first transaction marks and rolls back (the handler
    failed); its retry on the same connection marks and commits."""
    with psycopg.connect(_dsn(source)) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            assert mark_sync(adapt(conn), "billing", "m-1")
            raise RuntimeError("the handler failed")
        with conn.transaction():
            assert mark_sync(adapt(conn), "billing", "m-1")  # new: the first mark rolled back
        with conn.transaction():
            assert not mark_sync(adapt(conn), "billing", "m-1")  # seen
        assert conn.execute("SELECT count(*) FROM dw_inbox").fetchone() == (1,)


def test_inbox_sqlalchemy_async_after_a_rolled_back_first_mark(source: tuple[str, str]) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    url, args = _sa_url(source)

    async def main() -> None:
        engine = create_async_engine(url, connect_args=args)
        async with AsyncSession(engine) as session:
            with pytest.raises(RuntimeError):
                async with session.begin():
                    assert await mark(adapt(session), "billing", "m-1")
                    raise RuntimeError("the handler failed")
            async with session.begin():
                assert await mark(adapt(session), "billing", "m-1")
            async with session.begin():
                assert not await mark(adapt(session), "billing", "m-1")
                n = (await session.execute(text("SELECT count(*) FROM dw_inbox"))).scalar()
                assert n == 1
        await engine.dispose()

    asyncio.run(main())


def test_inbox_in_a_retried_handler_on_a_long_lived_connection(
    source: tuple[str, str], tmp_path: Path
) -> None:
    """What a user sees: the handler's effect and mark roll back with its
    failure; the retry, on the same connection, does the effect once."""
    a = dw.App(f"sqlite:///{tmp_path}/broker.db")
    conn = psycopg.connect(_dsn(source))
    conn.execute("CREATE TABLE charges (order_id TEXT)")
    conn.commit()
    attempts: list[int] = []

    @a.task(retry=dw.Retry(attempts=3, backoff=0.01))
    def charge(order_id: str, ctx: dw.Context) -> None:
        attempts.append(ctx.attempt)
        with conn.transaction():
            if ctx.inbox(conn):
                conn.execute("INSERT INTO charges VALUES (%s)", (order_id,))
            if len(attempts) == 1:
                raise ConnectionError("the payment gateway timed out")

    job = charge.enqueue("o-1")
    asyncio.run(drain(a))
    assert job.status() == dw.State.SUCCEEDED
    assert len(attempts) == 2
    assert conn.execute("SELECT count(*) FROM charges").fetchone() == (1,)
    conn.close()
    a.close()
