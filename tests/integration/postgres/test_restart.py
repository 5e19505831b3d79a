"""Surviving the server: every connection of the broker is ended mid-run.

Restarting the shared PostgreSQL server would disturb everyone using it, so
the test does to the broker what a restart does to it: it ends every backend
whose ``application_name`` is this test's own schema (a worker process, the
producer's pool, the LISTEN connections), from a separate connection, three
times while a worker drains and a producer keeps enqueuing.  Then every job
whose enqueue returned must succeed: nothing committed is lost, the worker
reconnects by itself, and no producer call fails.
"""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.integration.postgres import server
from tests.integration.restart import cut_connections_mid_run


def _terminate(application_name: str) -> int:
    """End every backend of this test (never anyone else's); how many there were."""
    with psycopg.connect(server.SERVER, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    return len(rows)


def test_workers_and_producers_reconnect_after_their_backends_are_ended(
    schema: str, tmp_path: Path
) -> None:
    cut_connections_mid_run(server.url(schema), tmp_path, lambda: _terminate(schema))
