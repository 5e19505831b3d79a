"""Migrations: up from an empty schema, explicit upgrades, refusal of an old or newer schema."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import psycopg
import pytest
from click.testing import CliRunner

from dumbwaiter.brokers.postgres import PostgresBroker
from dumbwaiter.brokers.postgres.migrations import SCHEMA_VERSION, migration_sql, migrations
from dumbwaiter.cli import main
from dumbwaiter.errors import ConfigurationError
from tests.conformance.conftest import msg
from tests.integration.postgres import server


def _tables(schema: str) -> set[str]:
    with psycopg.connect(server.SERVER) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


async def test_broker_refuses_an_empty_schema_and_names_the_command(
    make_broker: Callable[..., PostgresBroker], schema: str
) -> None:
    broker = make_broker(migrate="check")
    with pytest.raises(ConfigurationError, match="dumbwaiter migrate") as exc:
        await broker.enqueue([msg()])
    assert "?migrate=auto" in str(exc.value)
    with pytest.raises(ConfigurationError, match="dumbwaiter migrate"):
        broker.enqueue_sync([msg()])
    assert _tables(schema) == set()  # nothing was created behind the user's back


def test_migrate_command_upgrades_from_empty_then_has_nothing_to_do(
    make_url: Callable[..., str], schema: str
) -> None:
    url = make_url(migrate="check")
    runner = CliRunner()
    dry = runner.invoke(main, ["migrate", "--url", url, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would apply 0001_initial" in dry.output
    assert _tables(schema) == set()
    sql = runner.invoke(main, ["migrate", "--url", url, "--sql"])
    assert sql.exit_code == 0 and "CREATE TABLE dw_jobs" in sql.output
    done = runner.invoke(main, ["migrate", "--url", url])
    assert done.exit_code == 0, done.output
    assert f"version 0 -> {SCHEMA_VERSION}" in done.output
    assert {"dw_jobs", "dw_schema_version", "dw_kv", "dw_locks", "dw_queues"} <= _tables(schema)
    again = runner.invoke(main, ["migrate", "--url", url])
    assert again.exit_code == 0 and "up to date" in again.output
    broker = PostgresBroker(url)
    try:
        assert broker.enqueue_sync([m := msg()]) == [m.id]
        assert broker.migrate(dry_run=True) == []  # nothing pending
    finally:
        asyncio.run(broker.close())


async def test_sql_files_run_by_hand_satisfy_the_broker(
    make_broker: Callable[..., PostgresBroker], schema: str
) -> None:
    """What an Alembic or Django migration does: run the files with search_path set."""
    with psycopg.connect(server.SERVER, autocommit=True) as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        for migration in migrations():
            conn.execute(migration_sql(migration.version).encode())
    broker = make_broker(migrate="check")
    m = msg()
    assert await broker.enqueue([m]) == [m.id]
    assert broker.schema_version() == SCHEMA_VERSION


async def test_an_older_schema_is_refused(
    make_broker: Callable[..., PostgresBroker], schema: str
) -> None:
    make_broker().migrate()
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        # as if the newest migration had not been applied yet
        conn.execute(
            f'DELETE FROM "{schema}".dw_schema_version WHERE version = %s',
            (SCHEMA_VERSION,),
        )
    with pytest.raises(ConfigurationError, match=f"needs version {SCHEMA_VERSION}"):
        await make_broker(migrate="check").stats()


async def test_a_newer_schema_is_refused(
    make_broker: Callable[..., PostgresBroker], schema: str
) -> None:
    make_broker().migrate()
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".dw_schema_version (version, name)'
            " VALUES (%s, 'from the future')",
            (SCHEMA_VERSION + 1,),
        )
    with pytest.raises(ConfigurationError, match="upgrade dumbwaiter"):
        await make_broker(migrate="check").stats()
    with pytest.raises(ConfigurationError, match="upgrade dumbwaiter"):
        make_broker().migrate()


async def test_concurrent_auto_migrations_apply_once(
    make_broker: Callable[..., PostgresBroker],
) -> None:
    brokers = [make_broker() for _ in range(4)]
    await asyncio.gather(*(b.stats() for b in brokers))  # each connects and migrates
    assert brokers[0].schema_version() == SCHEMA_VERSION


async def test_an_upgrade_applies_only_what_is_pending(
    make_url: Callable[..., str], schema: str
) -> None:
    """A schema left at version 1 (as an older dumbwaiter made it) is upgraded
    explicitly, by the next migrations only, and its jobs survive."""
    assert SCHEMA_VERSION >= 2
    with psycopg.connect(server.SERVER, autocommit=True) as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'SET LOCAL search_path TO "{schema}"')
        conn.execute(migration_sql(1).encode())
    url = make_url(migrate="check")
    refused = PostgresBroker(url)
    with pytest.raises(ConfigurationError, match="version 1; this version of dumbwaiter needs"):
        refused.enqueue_sync([msg()])
    await refused.close()
    kept = PostgresBroker(make_url(migrate="check"))
    with psycopg.connect(server.SERVER, autocommit=True) as conn:  # a job of the old version
        conn.execute(
            f'INSERT INTO "{schema}".dw_jobs (id, queue, name, kind, max_attempts, body)'
            " VALUES (gen_random_uuid(), 'default', 'old', 'task', 1, '\\x7b7d')"
        )
    result = CliRunner().invoke(main, ["migrate", "--url", url])
    assert result.exit_code == 0, result.output
    assert "0001" not in result.output and "applied 0002_events" in result.output
    assert f"version 1 -> {SCHEMA_VERSION}" in result.output
    [stats] = await kept.stats()
    assert stats.ready == 1
    await kept.close()


def test_migration_files_are_safe_to_paste_anywhere() -> None:
    """No ``%`` (DB-API drivers with pyformat parameters would read it) and no
    ``:name`` (SQLAlchemy's text() would read a bind parameter)."""
    for m in migrations():
        assert "%" not in m.sql, m.name
        assert not re.search(r"(?<!:):[A-Za-z_]", m.sql), m.name
