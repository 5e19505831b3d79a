"""One small adapter over the caller's database connection.

The outbox and the inbox write into the caller's own transaction, on
whatever connection the caller holds: a ``sqlite3.Connection``, a psycopg
``Connection`` or ``AsyncConnection``, or a SQLAlchemy ``Connection``,
``Session``, ``AsyncConnection`` or ``AsyncSession``.  This module gives them
one shape: statements written with ``:name`` parameters, run sync or async,
the dialect (``sqlite`` or ``postgresql``), and where the database is, so the
outbox can tell when it is the broker's own database.

It never begins or commits: the caller's transaction decides.
"""

from __future__ import annotations

import os
import re
import weakref
from typing import Any

from .errors import ConfigurationError

_NAMED = re.compile(r"(?<!:):([a-z_][a-z0-9_]*)")
_done: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


class Sql:
    """The caller's connection, as the outbox and inbox use it."""

    dialect: str
    is_async: bool

    def __init__(self, raw: Any, dialect: str, is_async: bool, kind: str) -> None:
        self.raw = raw
        self.dialect = dialect
        self.is_async = is_async
        self.kind = kind  # sqlite3 | psycopg | sqlalchemy

    def flag(self, name: str) -> bool:
        """True if ``name`` was already done on this connection; marks it done."""
        try:
            seen = _done.setdefault(self.raw, set())
        except TypeError:  # not weak-referenceable: do it every time
            return False
        if name in seen:
            return True
        seen.add(name)
        return False

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
