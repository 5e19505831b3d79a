"""The SQLite broker's tables (schema.sql), created where they are missing.

A database is made whole by this version's schema.sql, or refused with the
reason: one written by a newer dumbwaiter, or by a pre-release whose tables
this version does not read.
"""

from __future__ import annotations

import sqlite3
from importlib import resources

from ...errors import ConfigurationError

#: the version schema.sql writes (1: a pre-release's tables, without dw_jobs.msg_key)
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


def check_version(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a database this version cannot use (none yet is fine)."""
    try:
        row = conn.execute("SELECT v FROM dw_meta WHERE k='schema_version'").fetchone()
    except sqlite3.OperationalError:  # no dw_meta: a new file
        return
    version = None if row is None else int(row[0])
    if version is None or version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise ConfigurationError(
            f"{path} has dumbwaiter schema {version}, newer than this version "
            f"({SCHEMA_VERSION}) understands; upgrade dumbwaiter"
        )
    raise ConfigurationError(
        f"{path} has dumbwaiter schema {version}, written by a pre-release of dumbwaiter "
        f"whose tables this version ({SCHEMA_VERSION}) does not read; let its workers "
        "finish its jobs, then delete the file (and its -wal and -shm files)"
    )


def apply_schema(conn: sqlite3.Connection, path: str) -> None:
    """Create what is missing (every statement is IF NOT EXISTS), in the
    caller's transaction, once the database's version is known to be ours."""
    check_version(conn, path)
    for stmt in _schema_statements():
        conn.execute(stmt)
