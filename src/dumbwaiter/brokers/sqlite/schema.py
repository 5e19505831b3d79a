"""The SQLite broker's tables (schema.sql), created and upgraded in place."""

from __future__ import annotations

import sqlite3
from importlib import resources

#: 2: dw_jobs.msg_key (every job's Message.key, indexed for key search)
SCHEMA_VERSION = 2


def _schema() -> str:
    return resources.files(__package__).joinpath("schema.sql").read_text()


def _schema_statements() -> list[str]:
    """The schema as single statements (comments may hold semicolons)."""
    out, buf = [], ""
    for line in _schema().splitlines(keepends=True):
        if not buf and (not line.strip() or line.lstrip().startswith("--")):
            continue
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return out


#: columns of dw_jobs that older schemas lack, with their type (added in order)
_ADDED_COLUMNS = (("msg_key", "TEXT"),)  # version 2


def apply_schema(conn: sqlite3.Connection) -> None:
    """Create what is missing and upgrade an older database, in the caller's
    transaction.  schema.sql is idempotent except for new columns of an
    existing dw_jobs (SQLite has no ADD COLUMN IF NOT EXISTS): those are
    added here first, so the file's indexes and backfills can name them."""
    have = {r[0] for r in conn.execute("SELECT name FROM pragma_table_info('dw_jobs')")}
    if have:  # an existing table (none yet: schema.sql creates it whole)
        for name, decl in _ADDED_COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE dw_jobs ADD COLUMN {name} {decl}")
    for stmt in _schema_statements():
        conn.execute(stmt)
