"""One small adapter over the caller's database connection.

The outbox and the inbox write into the caller's own transaction, on
whatever connection the caller holds: a ``sqlite3.Connection``, a psycopg
``Connection`` or ``AsyncConnection``, or a SQLAlchemy ``Connection``,
``Session``, ``AsyncConnection`` or ``AsyncSession``.  This module gives them
one shape: statements written with ``:name`` parameters, run sync or async,
the dialect (``sqlite`` or ``postgresql``), and where the database is, so the
outbox can tell when it is the broker's own database.

It never begins or commits: the caller's transaction decides.  That is why
the tables the outbox and inbox make for themselves (``ensure_table``) are
made in the caller's transaction too, and remembered only once they are
known to be committed: a rollback takes a ``CREATE TABLE`` with it.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Sequence
from typing import Any

from .errors import ConfigurationError

_NAMED = re.compile(r"(?<!:):([a-z_][a-z0-9_]*)")
#: per driver connection, per table: True once the table is known committed,
#: else the id of the (maybe still open) transaction that created it
_tables: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


class Sql:
    """The caller's connection, as the outbox and inbox use it."""

    dialect: str
    is_async: bool

    def __init__(self, raw: Any, dialect: str, is_async: bool, kind: str) -> None:
        self.raw = raw
        self.dialect = dialect
        self.is_async = is_async
        self.kind = kind  # sqlite3 | psycopg | sqlalchemy

    # -- the driver's connection, which outlives a Session or a pooled checkout ----

    def driver_sync(self) -> Any:
        """The DBAPI connection under the caller's (a sqlite3 or psycopg one
        is its own); a SQLAlchemy one is begun first, as its ``execute`` would."""
        if self.kind != "sqlalchemy":
            return self.raw
        conn = self.raw.connection() if hasattr(self.raw, "get_bind") else self.raw
        return conn.connection.driver_connection

    async def driver(self) -> Any:
        if self.kind != "sqlalchemy":
            return self.raw
        if hasattr(self.raw, "get_bind"):  # an AsyncSession
            conn = await self.raw.connection()
        else:
            conn = self.raw
        return (await conn.get_raw_connection()).driver_connection

    # -- sync ----------------------------------------------------------------------

    def execute_sync(self, sql: str, params: dict[str, Any]) -> int:
        if self.kind == "sqlite3":
            return int(self.raw.execute(sql, params).rowcount)
        if self.kind == "psycopg":
            return int(self.raw.execute(_pyformat(sql), params).rowcount)
        return int(self.raw.execute(_text(sql), params).rowcount)

    def execute_many_sync(self, sql: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self.kind == "sqlite3":
            self.raw.executemany(sql, rows)
        elif self.kind == "psycopg":
            with self.raw.cursor() as cur:
                cur.executemany(_pyformat(sql), rows)
        else:
            self.raw.execute(_text(sql), rows)

    def fetch_sync(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite3":
            return list(self.raw.execute(sql, params).fetchall())
        if self.kind == "psycopg":
            return list(self.raw.execute(_pyformat(sql), params).fetchall())
        return [tuple(r) for r in self.raw.execute(_text(sql), params).fetchall()]

    def notify_sync(self, channel: str) -> None:
        """Wake a LISTENing relay when the transaction commits (PostgreSQL only)."""
        if self.dialect == "postgresql":
            self.execute_sync("SELECT pg_notify(:ch, '')", {"ch": channel})

    # -- async -----------------------------------------------------------------

    async def execute(self, sql: str, params: dict[str, Any]) -> int:
        if self.kind == "psycopg":
            cur = await self.raw.execute(_pyformat(sql), params)
            return int(cur.rowcount)
        result = await self.raw.execute(_text(sql), params)
        return int(result.rowcount)

    async def execute_many(self, sql: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self.kind == "psycopg":
            async with self.raw.cursor() as cur:
                await cur.executemany(_pyformat(sql), rows)
        else:
            await self.raw.execute(_text(sql), rows)

    async def fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        if self.kind == "psycopg":
            cur = await self.raw.execute(_pyformat(sql), params)
            return list(await cur.fetchall())
        result = await self.raw.execute(_text(sql), params)
        return [tuple(r) for r in result.fetchall()]

    async def notify(self, channel: str) -> None:
        if self.dialect == "postgresql":
            await self.execute("SELECT pg_notify(:ch, '')", {"ch": channel})

    # -- where the database is -------------------------------------------------------

    def sqlite_path(self) -> str | None:
        """The main database file of a SQLite connection (absolute), or None."""
        if self.dialect != "sqlite":
            return None
        if self.kind == "sqlite3":
            rows = self.raw.execute("PRAGMA database_list").fetchall()
            path = next((r[2] for r in rows if r[1] == "main"), "")
        else:
            path = _sqlalchemy_bind(self.raw).url.database or ""
        return os.path.realpath(path) if path else None


# -- tables made on first use, in the caller's transaction ---------------------------
#
# A CREATE TABLE in the caller's transaction is undone by its rollback, so
# "made" is remembered only once it cannot be undone: the table was found in
# a transaction other than the one that made it (that one committed, or
# another did), or it was there before this connection ever looked.  Until
# then each write asks the server first, in one statement that also names the
# transaction (PostgreSQL's top-level txid, the same inside savepoints).
# Once known, a write costs nothing extra.  SQLite has no transaction id: it
# asks every time, a lookup in the connection's own schema cache, no round trip.

_PROBE = {
    "postgresql": "SELECT to_regclass('{t}') IS NOT NULL, txid_current()::text",
    "sqlite": "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table'"
    " AND name = '{t}'), NULL",
}


def _record(driver: Any) -> dict[str, Any] | None:
    """A PostgreSQL connection's record of its tables (None: ask every time)."""
    try:
        return _tables.setdefault(driver, {})
    except TypeError:  # not weak-referenceable
        return None


def _settle(seen: dict[str, Any] | None, table: str, row: tuple[Any, ...]) -> bool:
    """Record what the probe found; True if the table is there to write to."""
    exists, txn = bool(row[0]), row[1]
    if seen is None:
        return exists
    if exists:
        if seen.get(table) != txn:  # not (only) made by this open transaction
            seen[table] = True
        return True
    seen[table] = txn  # made below, by this transaction: not yet known to last
    return False


def ensure_table_sync(sql: Sql, table: str, ddl: Sequence[str]) -> None:
    """Make ``table`` with ``ddl`` in the caller's transaction if it is missing."""
    seen = _record(sql.driver_sync()) if sql.dialect == "postgresql" else None
    if seen is not None and seen.get(table) is True:
        return
    rows = sql.fetch_sync(_PROBE[sql.dialect].format(t=table), {})
    if not _settle(seen, table, rows[0]):
        for stmt in ddl:
            sql.execute_sync(stmt, {})


async def ensure_table(sql: Sql, table: str, ddl: Sequence[str]) -> None:
    seen = _record(await sql.driver()) if sql.dialect == "postgresql" else None
    if seen is not None and seen.get(table) is True:
        return
    rows = await sql.fetch(_PROBE[sql.dialect].format(t=table), {})
    if not _settle(seen, table, rows[0]):
        for stmt in ddl:
            await sql.execute(stmt, {})


def _pyformat(sql: str) -> str:
    """``:name`` -> psycopg's ``%(name)s`` (and a literal ``%`` doubled)."""
    return _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


def _text(sql: str) -> Any:
    from sqlalchemy import text

    return text(sql)


def _sqlalchemy_bind(raw: Any) -> Any:
    bind = raw.get_bind() if hasattr(raw, "get_bind") else raw
    return getattr(bind, "engine", bind)


def adapt(conn: Any) -> Sql:
    """Wrap any supported connection; a clear error for anything else."""
    if isinstance(conn, Sql):
        return conn
    module = type(conn).__module__
    name = type(conn).__name__
    if module == "sqlite3" and name == "Connection":
        return Sql(conn, "sqlite", False, "sqlite3")
    if module.startswith("psycopg"):
        return Sql(conn, "postgresql", name == "AsyncConnection", "psycopg")
    if module.startswith("sqlalchemy"):
        is_async = name in ("AsyncConnection", "AsyncSession")
        target = conn.sync_session if name == "AsyncSession" else conn
        if name == "AsyncConnection":
            target = conn.sync_connection
        if target is None:
            raise ConfigurationError("this SQLAlchemy AsyncConnection is not connected yet")
        dialect = _sqlalchemy_bind(target).dialect.name
        if dialect not in ("sqlite", "postgresql"):
            raise ConfigurationError(
                f"the outbox and inbox support SQLite and PostgreSQL, not {dialect}"
            )
        return Sql(conn, dialect, is_async, "sqlalchemy")
    raise ConfigurationError(
        f"{module}.{name} is not a supported connection: pass a sqlite3 connection, a "
        "psycopg (Async)Connection, or a SQLAlchemy (Async)Connection or (Async)Session"
    )
