"""The PostgreSQL server the tests use, and a fresh schema per test.

``DW_TEST_PG`` names the server and database (default: the local ``test``
database).  Each test gets its own schema (``dwt_<pid>_<n>``), created by the
broker itself (``?migrate=auto``) and dropped when the test process exits;
tests never touch a schema they did not make.  Connections carry
``application_name=<schema>``, so a test can end exactly its own backends.
"""

from __future__ import annotations

import itertools
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests import atend
from tests.conftest import require_service

SERVER = os.environ.get("DW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

_made: dict[Path, str] = {}
_counter = itertools.count()
_reachable: tuple[bool, str] | None = None


def _check() -> tuple[bool, str]:
    global _reachable
    if _reachable is None:
        try:
            import psycopg

            try:
                with psycopg.connect(SERVER, connect_timeout=3) as conn:
                    conn.execute("SELECT 1")
            except psycopg.OperationalError as exc:
                if "does not exist" not in str(exc):
                    raise
                _create_database()  # a fresh server (CI) may not have it yet
            _reachable = (True, "")
        except ImportError as exc:
            _reachable = (False, f"psycopg is not installed ({exc}): pip install -e '.[dev]'")
        except Exception as exc:
            _reachable = (False, f"{SERVER}: {exc}")
    return _reachable


def _create_database() -> None:
    import psycopg
    from psycopg import sql

    parts = urlsplit(SERVER)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=3) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def new_schema() -> str:
    ok, why = _check()
    require_service("PostgreSQL", ok, why)
    name = f"dwt_{os.getpid()}_{next(_counter)}_{secrets.token_hex(2)}"
    if not _made:
        atend.register(drop_schemas)
    _made[Path(f"/schema/{name}")] = name
    return name


def url(schema: str, **options: str) -> str:
    opts = {"schema": schema, "migrate": "auto", "application_name": schema, **options}
    query = "&".join(f"{k}={v}" for k, v in opts.items())
    return f"{SERVER}?{query}"


def postgres_url(tmp_path: Path) -> str:
    """The conformance suite's URL: one schema per ``tmp_path`` (per test)."""
    schema = _made.get(tmp_path)
    if schema is None:
        schema = new_schema()
        _made[tmp_path] = schema
    return url(schema)


def drop_schemas() -> None:
    """Drop every schema this process made (at exit)."""
    names = sorted(set(_made.values()))
    _made.clear()
    drop(names)


def drop(names: list[str]) -> None:
    """Drop these schemas (made by this process) and everything in them."""
    import psycopg

    for key in [k for k, v in _made.items() if v in names]:
        del _made[key]
    if not names:
        return
    try:
        with psycopg.connect(SERVER, autocommit=True, connect_timeout=3) as conn:
            for name in names:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    except Exception:  # the server went away: nothing more to do at exit
        pass
