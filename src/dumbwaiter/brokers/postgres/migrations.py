"""The PostgreSQL schema's migrations: plain SQL files, applied in order.

Each file ``sql/NNNN_name.sql`` is one step.  It uses unqualified table
names and ends by recording itself in ``dw_schema_version``, so the same text
works from ``dumbwaiter migrate`` (which sets ``search_path`` to the target
schema) and from an Alembic or Django migration run by hand::

    from dumbwaiter.brokers.postgres.migrations import migration_sql
    op.execute(migration_sql(1))            # Alembic
    migrations.RunSQL(migration_sql(1))      # Django

The broker never changes the schema behind the user's back: it checks the
recorded versions when it connects and refuses to run while one of its
migrations is not applied (unless the URL says ``?migrate=auto``, meant for
development and tests).

Versions need not be contiguous: what is pending is each shipped migration
whose version is not recorded, not "everything above the highest".  Two
changes developed apart take two numbers (0005, 0006) and a database that
got the higher one first still gets the lower one, so independent
migrations merge without renumbering.  A recorded version this code does not
ship means a newer dumbwaiter made the schema: refused.
"""

from __future__ import annotations

import itertools
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
    for a, b in itertools.pairwise(out):
        if a.version == b.version:
            raise RuntimeError(f"two migrations numbered {a.version}: {a.name}, {b.name}")
    return out


#: the schema version this code needs (the newest migration it ships)
SCHEMA_VERSION = max(m.version for m in migrations())
#: every version this code ships (a gap is a number another change took)
SHIPPED = frozenset(m.version for m in migrations())


def migration_sql(version: int) -> str:
    """The SQL text of one migration (for Alembic's ``op.execute`` or Django's ``RunSQL``)."""
    for m in migrations():
        if m.version == version:
            return m.sql
    raise KeyError(f"no dumbwaiter migration {version} (this version ships {sorted(SHIPPED)})")


def pending(applied: set[int]) -> list[Migration]:
    """The shipped migrations not yet recorded, oldest first."""
    return [m for m in migrations() if m.version not in applied]


def unknown(applied: set[int]) -> set[int]:
    """Recorded versions this code does not ship: a newer dumbwaiter's."""
    return applied - SHIPPED


def exists_query(schema: str) -> sql.Composed:
    """Whether the version table exists (a table in a missing schema cannot be read)."""
    return sql.SQL("SELECT to_regclass({name}) IS NOT NULL").format(
        name=sql.Literal(sql.Identifier(schema).as_string() + ".dw_schema_version")
    )


def versions_query(schema: str) -> sql.Composed:
    return sql.SQL("SELECT version FROM {table}").format(
        table=sql.Identifier(schema, "dw_schema_version")
    )


def applied_versions(conn: psycopg.Connection[Any], schema: str) -> set[int]:
    """The recorded versions (none when there are no dumbwaiter tables in ``schema``)."""
    row = conn.execute(exists_query(schema)).fetchone()
    if not row or not row[0]:
        return set()
    return {int(r[0]) for r in conn.execute(versions_query(schema)).fetchall()}


async def aapplied_versions(conn: psycopg.AsyncConnection[Any], schema: str) -> set[int]:
    row = await (await conn.execute(exists_query(schema))).fetchone()
    if not row or not row[0]:
        return set()
    return {int(r[0]) for r in await (await conn.execute(versions_query(schema))).fetchall()}


def current_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The highest recorded version (0 when there are no dumbwaiter tables in ``schema``)."""
    return max(applied_versions(conn, schema), default=0)


def too_old(schema: str, applied: set[int]) -> ConfigurationError:
    found = max(applied, default=0)
    what = "no dumbwaiter tables" if found == 0 else f"dumbwaiter schema version {found}"
    missing = [m.version for m in pending(applied) if m.version < found]
    if missing:  # a gap: a migration numbered below the newest was not applied
        what += f" without migration {', '.join(map(str, missing))}"
    return ConfigurationError(
        f'PostgreSQL schema "{schema}" has {what}; this version of dumbwaiter needs version '
        f"{SCHEMA_VERSION}. Run `dumbwaiter migrate` (with the same --url or --app) to apply "
        "the pending migrations, or add ?migrate=auto to the URL in development and tests."
    )


def too_new(schema: str, applied: set[int]) -> ConfigurationError:
    found = max(unknown(applied) or applied)
    return ConfigurationError(
        f'PostgreSQL schema "{schema}" has dumbwaiter schema version {found}, which this '
        f"version of dumbwaiter does not know (it ships {sorted(SHIPPED)}); upgrade dumbwaiter"
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
