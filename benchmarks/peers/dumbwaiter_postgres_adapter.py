"""dumbwaiter on its PostgreSQL broker in the peers harness, next to pgqueuer
and procrastinate on the same server and database (the harness' ``PG_DSN``,
database ``bench``).

dumbwaiter's tables live in a schema of their own (``dumbwaiter_bench``, or
``$DUMBWAITER_BENCH_PG_SCHEMA``), so resetting them never touches the peers'
tables: ``reset`` applies pending migrations (as pgqueuer's adapter runs ``pgq
install`` the first time) and then truncates dumbwaiter's tables.  The URL has
no ``?migrate=auto``: the worker runs on a migrated schema, as in production.
A branch whose schema is newer than main's benchmarks in a schema of its own
(the variable): migrating the shared one would make main's code refuse it.

Worker side: ``dumbwaiter worker --app dumbwaiter_postgres_adapter:postgres_app``.
"""

from __future__ import annotations

import os

from dumbwaiter_adapter import DumbwaiterAdapter, _app
from peers.adapters.base import Adapter
from peers.common import PG_DSN, pg_execute

from dumbwaiter.brokers.postgres import PostgresBroker

SCHEMA = os.environ.get("DUMBWAITER_BENCH_PG_SCHEMA", "dumbwaiter_bench")
_sep = "&" if "?" in PG_DSN else "?"
POSTGRES_URL = f"{PG_DSN}{_sep}schema={SCHEMA}&application_name=dumbwaiter-bench"
#: dw_waiters too (migration 0005): a wait left by the last run's worker must
#: not be handed a job of this one
#: what a reset empties: the jobs with their counters (a TRUNCATE fires no
#: row trigger, so ``dw_counts`` would keep counting the rows it removed)
TABLES = (
    "dw_jobs",
    "dw_counts",
    "dw_count_deltas",
    "dw_queues",
    "dw_locks",
    "dw_kv",
    "dw_events",
    "dw_bindings",
    "dw_waiters",
)

# Creating an App opens no connection until first use.
postgres_app, POSTGRES_TASKS = _app(POSTGRES_URL)


class DumbwaiterPostgresAdapter(DumbwaiterAdapter):
    """One ``dw_jobs`` table; claims with SKIP LOCKED, LISTEN/NOTIFY wake-ups."""

    notes = (
        "PostgreSQL (psycopg 3), schema dumbwaiter_bench in database bench; sync producer on a "
        "psycopg_pool connection pool, one autocommit statement (INSERT + NOTIFY) per enqueue; "
        "bulk = one INSERT ... SELECT FROM unnest(arrays) statement; finished rows are kept "
        "(retention 1 h) as in production."
    )

    def __init__(self) -> None:
        super().__init__("dumbwaiter-postgres", "postgres", POSTGRES_URL, "postgres_app")

    def open(self) -> None:
        # Producer-side clients are created here, not at the first enqueue
        # (the harness: "called once per run, before enqueues"; pgqueuer's
        # adapter connects here too): the sync pool connects and the schema
        # version is checked.  Not timed.
        super().open()
        assert self._app is not None
        broker = self._app.broker
        assert isinstance(broker, PostgresBroker)
        broker.open_sync()

    def worker_cmd(self, concurrency: int) -> list[str]:
        # the base class names its own module in --app; the App is defined here
        cmd = super().worker_cmd(concurrency)
        cmd[cmd.index("--app") + 1] = f"{__name__}:{self.app_attr}"
        return cmd

    def reset(self) -> None:
        PostgresBroker(POSTGRES_URL).migrate()  # pending migrations only; none: nothing
        pg_execute("TRUNCATE " + ", ".join(f"{SCHEMA}.{t}" for t in TABLES))

    def pending(self) -> int | None:
        rows = pg_execute(
            f"SELECT count(*) FROM {SCHEMA}.dw_jobs WHERE state = 'ready'", fetch=True
        )
        return int(rows[0][0])


ADAPTERS: list[Adapter] = [DumbwaiterPostgresAdapter()]
