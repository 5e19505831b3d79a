"""The transactional outbox's fast path: the caller's transaction writes the jobs.

When ``app.outbox(conn)`` is given a connection to the broker's own
database, jobs and events need no outbox table and no relay: the broker's
usual statements run on the caller's connection, inside the caller's
transaction, so the jobs (and their ``NOTIFY``) appear at its commit and
vanish with its rollback.

**Same database** is decided on the server, once per connection, by three
values read by both sides: ``current_database()``, a random id that
migration 0003 stores in the broker's schema (``dw_instance``), and, where
the role may read it, the cluster's ``system_identifier``.  Host names,
ports, sockets, poolers and proxies do not matter; a copy of the database
made with ``CREATE DATABASE ... TEMPLATE`` has another name, and one restored
on another server another system identifier.  The caller's role must be
allowed to write the broker's tables (checked from the catalogs, so a probe
never fails the caller's transaction); if it is not, the outbox table and
the relay are used instead, as for any other database.

Connections: psycopg 3 ``Connection``/``AsyncConnection``, and SQLAlchemy
``Connection``/``Session`` (sync and async) whose driver is psycopg 3
(``postgresql+psycopg://``).  Other drivers (psycopg2, asyncpg) go through
the outbox table.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

from ...errors import ConfigurationError
from ...sqldb import Sql

#: what the caller's role needs, table by table, for the fast path
_NEEDS = (
    ("dw_instance", "SELECT"),
    ("dw_jobs", "SELECT"),
    ("dw_jobs", "INSERT"),
    ("dw_jobs", "UPDATE"),
    ("dw_queues", "INSERT"),
    ("dw_events", "SELECT"),
    ("dw_events", "INSERT"),
    ("dw_bindings", "SELECT"),
)
# Catalog reads only: a missing schema or a missing privilege gives false,
# never an error (which would abort the caller's transaction).
_PROBE = (
    b"SELECT current_database(),"
    b" has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE'),"
    b" coalesce((SELECT has_schema_privilege(n.oid, 'USAGE')"
    b" AND bool_and(has_table_privilege(c.oid, p.priv)) AND count(*) = %s"
    b" FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid"
    b" JOIN unnest(%s::text[], %s::text[]) AS p(rel, priv) ON c.relname = p.rel"
    b" WHERE n.nspname = %s GROUP BY n.oid), false)"
)


class Identity(NamedTuple):
    database: str
    instance: str
    #: None where the role may not read it
    system: str | None

    def same(self, other: Identity) -> bool:
        if self.database != other.database or self.instance != other.instance:
            return False
        return self.system is None or other.system is None or self.system == other.system


def _probe_params(schema: str) -> tuple[Any, ...]:
    return (len(_NEEDS), [t for t, _ in _NEEDS], [p for _, p in _NEEDS], schema)


def _ids_query(schema: str, system: bool) -> bytes:
    s = '"' + schema.replace('"', '""') + '"'
    sysid = "(SELECT system_identifier::text FROM pg_catalog.pg_control_system())"
    return (
        f"SELECT (SELECT id FROM {s}.dw_instance ORDER BY created_at LIMIT 1),"
        f" {sysid if system else 'NULL::text'}"
    ).encode()


def read_identity(conn: psycopg.Connection[Any], schema: str) -> Identity | None:
    """The identity of ``conn``'s database as seen for ``schema``; None when the
    schema is not there or the role may not use it for the fast path."""
    cur = conn.cursor(row_factory=tuple_row)
    row = cur.execute(_PROBE, _probe_params(schema)).fetchone()
    if row is None or not row[2]:
        return None
    ids = cur.execute(_ids_query(schema, bool(row[1]))).fetchone()
    if ids is None or ids[0] is None:
        return None
    return Identity(str(row[0]), str(ids[0]), ids[1])


async def aread_identity(conn: psycopg.AsyncConnection[Any], schema: str) -> Identity | None:
    cur = conn.cursor(row_factory=tuple_row)
    row = await (await cur.execute(_PROBE, _probe_params(schema))).fetchone()
    if row is None or not row[2]:
        return None
    ids = await (await cur.execute(_ids_query(schema, bool(row[1])))).fetchone()
    if ids is None or ids[0] is None:
        return None
    return Identity(str(row[0]), str(ids[0]), ids[1])


def driver(sql: Sql) -> psycopg.Connection[Any] | None:
    """The psycopg connection under a sync caller's connection (None: another driver).

    A SQLAlchemy connection is put in its transaction first (what its first
    ``execute`` would do), so its commit or rollback is the caller's."""
    raw = sql.raw
    if sql.dialect != "postgresql" or sql.is_async:
        return None
    if sql.kind == "psycopg":
        return raw if isinstance(raw, psycopg.Connection) else None
    conn = raw.connection() if hasattr(raw, "get_bind") else raw  # a Session: its connection
    if not conn.in_transaction():
        conn.begin()
    found = conn.connection.driver_connection
    return found if isinstance(found, psycopg.Connection) else None


async def adriver(sql: Sql) -> psycopg.AsyncConnection[Any] | None:
    """``driver`` for async callers (psycopg ``AsyncConnection``, SQLAlchemy
    ``AsyncConnection`` or ``AsyncSession``)."""
    raw = sql.raw
    if sql.dialect != "postgresql" or not sql.is_async:
        return None
    if sql.kind == "psycopg":
        return raw if isinstance(raw, psycopg.AsyncConnection) else None
    if hasattr(raw, "get_bind"):  # an AsyncSession: its connection, in its transaction
        conn = await raw.connection()
    else:
        conn = raw
        if not conn.in_transaction():
            await conn.begin()
    found = (await conn.get_raw_connection()).driver_connection
    return found if isinstance(found, psycopg.AsyncConnection) else None


def check_in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """An autocommit connection outside ``conn.transaction()`` would commit each
    statement at once: refuse, as the SQLite fast path does."""
    if conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        raise ConfigurationError(
            "app.outbox(conn) on an autocommit psycopg connection needs a transaction: "
            "use `with conn.transaction():`, so the job commits (or rolls back) with your changes"
        )


__all__ = ["Identity", "adriver", "aread_identity", "check_in_transaction", "driver"]
