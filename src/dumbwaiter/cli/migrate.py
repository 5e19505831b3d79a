"""``dumbwaiter migrate``: apply the broker's pending schema migrations.

Brokers with a schema of their own to upgrade (PostgreSQL) ship plain SQL
migration files and a version table; the broker refuses to run on an older
schema and names this command.  Embedded brokers (SQLite) create their tables
themselves, so for them there is nothing to do.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import click

from ..errors import DumbwaiterError
from .common import app_options, resolve_app


@runtime_checkable
class Migratable(Protocol):
    """A broker whose schema is upgraded explicitly."""

    schema: str

    def migrate(self, dry_run: bool = False) -> list[Any]: ...

    def schema_version(self) -> int: ...


@click.command()
@app_options
@click.option("--dry-run", is_flag=True, help="Show what would be applied; change nothing.")
@click.option(
    "--sql",
    "show_sql",
    is_flag=True,
    help="Print the SQL of the pending migrations instead of applying them "
    "(to paste into an Alembic or Django migration).",
)
def migrate(app_spec: str | None, url: str | None, dry_run: bool, show_sql: bool) -> None:
    """Create or upgrade the broker's tables (PostgreSQL).

    Applies every pending migration in one transaction and lists what it did.
    Safe to run again (nothing pending: nothing done) and from several
    machines at once (they take turns).
    """
    app = resolve_app(app_spec, url)
    broker = app.broker
    if not isinstance(broker, Migratable):
        scheme = app.url.split("://", 1)[0]
        click.echo(f"the {scheme}:// broker creates its own tables; nothing to migrate")
        return
    try:
        before = broker.schema_version()
        pending = broker.migrate(dry_run=True) if (dry_run or show_sql) else None
        if show_sql:
            for m in pending or []:
                click.echo(f"-- dumbwaiter migration {m.version:04d}_{m.name}")
                click.echo(m.sql)
            return
        if pending is None:
            pending = broker.migrate()
    except DumbwaiterError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # the server is unreachable, permissions...
        raise click.ClickException(f"migration failed: {exc}") from exc
    where = f'schema "{broker.schema}"'
    if not pending:
        click.echo(f"{where} is up to date (version {before}); nothing to apply")
        return
    verb = "would apply" if dry_run else "applied"
    for m in pending:
        click.echo(f"{verb} {m.version:04d}_{m.name}")
    after = pending[-1].version
    click.echo(f"{where}: version {before} -> {after}" + (" (dry run)" if dry_run else ""))
