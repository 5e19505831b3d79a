"""The PostgreSQL schema's migrations: plain SQL files, applied in order.

Each file ``sql/NNNN_name.sql`` is one step.  It uses unqualified table
names and ends by recording itself in ``dw_schema_version``, so the same text
works from ``dumbwaiter migrate`` (which sets ``search_path`` to the target
schema) and from an Alembic or Django migration run by hand::

    from dumbwaiter.brokers.postgres.migrations import migration_sql
    op.execute(migration_sql(1))            # Alembic
    migrations.RunSQL(migration_sql(1))      # Django

The broker never changes the schema behind the user's back: it checks the
recorded version when it connects and refuses to run on an older one (unless
the URL says ``?migrate=auto``, meant for development and tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from ...errors import ConfigurationError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with this version, oldest first."""
    out = []
    for entry in resources.files(__package__).joinpath("sql").iterdir():
        found = _FILE.match(entry.name)
        if found:
            out.append(Migration(int(found.group(1)), found.group(2), entry.read_text()))
    out.sort(key=lambda m: m.version)
    for i, m in enumerate(out, 1):
        if m.version != i:  # a gap would make "pending" ambiguous
            raise RuntimeError(f"migration files are not numbered 1..n: {m.version} at {i}")
    return out


#: the schema version this code needs (the newest migration it ships)
SCHEMA_VERSION = len(migrations())


def migration_sql(version: int) -> str:
    """The SQL text of one migration (for Alembic's ``op.execute`` or Django's ``RunSQL``)."""
    for m in migrations():
        if m.version == version:
            return m.sql
    raise KeyError(f"no dumbwaiter migration {version} (this version ships 1..{SCHEMA_VERSION})")


def exists_query(schema: str) -> sql.Composed:
    """Whether the version table exists (a table in a missing schema cannot be read)."""
    return sql.SQL("SELECT to_regclass({name}) IS NOT NULL").format(
        name=sql.Literal(sql.Identifier(schema).as_string() + ".dw_schema_version")
    )


def max_query(schema: str) -> sql.Composed:
    return sql.SQL("SELECT coalesce(max(version), 0) FROM {table}").format(
        table=sql.Identifier(schema, "dw_schema_version")
    )


def current_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The recorded version (0 when there are no dumbwaiter tables in ``schema``)."""
    row = conn.execute(exists_query(schema)).fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute(max_query(schema)).fetchone()
    return int(row[0]) if row else 0


async def acurrent_version(conn: psycopg.AsyncConnection[Any], schema: str) -> int:
    row = await (await conn.execute(exists_query(schema))).fetchone()
    if not row or not row[0]:
        return 0
    row = await (await conn.execute(max_query(schema))).fetchone()
    return int(row[0]) if row else 0


def too_old(schema: str, found: int) -> ConfigurationError:
    what = "no dumbwaiter tables" if found == 0 else f"dumbwaiter schema version {found}"
    return ConfigurationError(
        f'PostgreSQL schema "{schema}" has {what}; this version of dumbwaiter needs version '
        f"{SCHEMA_VERSION}. Run `dumbwaiter migrate` (with the same --url or --app) to apply "
        "the pending migrations, or add ?migrate=auto to the URL in development and tests."
    )


def too_new(schema: str, found: int) -> ConfigurationError:
    return ConfigurationError(
        f'PostgreSQL schema "{schema}" has dumbwaiter schema version {found}, newer than this '
        f"version of dumbwaiter understands ({SCHEMA_VERSION}); upgrade dumbwaiter"
    )


def lock_query(schema: str) -> sql.Composed:
    """A transaction-level advisory lock that serializes migrators of one schema."""
    return sql.SQL("SELECT pg_advisory_xact_lock(hashtext({key}))").format(
        key=sql.Literal(f"dumbwaiter.migrate:{schema}")
    )


def prelude(schema: str) -> sql.Composed:
    """Run before each migration's SQL, in its transaction."""
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}; SET LOCAL search_path TO {s}").format(
        s=sql.Identifier(schema)
    )
