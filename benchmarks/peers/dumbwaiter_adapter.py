"""dumbwaiter in the peers harness (/work/shared/bench/peers).

The harness imports this module from ``PEERS_EXTRA_ADAPTERS`` both in the
runner (producer side) and, by ``--app dumbwaiter_adapter:<attr>``, in the
worker process, so every App and its two tasks are defined at module level.

One adapter per broker: ``DumbwaiterAdapter`` holds what does not depend on
the broker (tasks, enqueue, bulk API, worker command) and is parametrized by
URL, backend and the module attribute naming the App; a subclass adds the
broker's housekeeping (``reset``, ``pending``).  A later Redis or Postgres
adapter is a module-level ``redis_app = _app(REDIS_URL)`` plus a subclass
whose ``reset`` is ``redis_flush()`` / a ``TRUNCATE`` (see
``peers.common``) and ``backend = "redis"`` / ``"postgres"``, which then also
gives it the harness' bare-client anchor.

Task bodies are the harness' async ones (``tasks.anoop``,
``tasks.asleep10ms``): dumbwaiter runs async handlers on the worker's loop,
as the harness does for the other asyncio libraries.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from peers import tasks
from peers.adapters.base import Adapter

import dumbwaiter as dw

#: Scratch folder of the SQLite database.  An absolute path, computed the
#: same way in the runner and in the worker (which inherits the runner's
#: environment), so both open the same file.  The default is on the same
#: ext4 disk as Postgres' data directory on the benchmark machine, not tmpfs:
#: fsync costs what it costs the Postgres peers.
SCRATCH = Path(os.environ.get("DUMBWAITER_BENCH_DIR", "/tmp/dumbwaiter-bench")).resolve()
SQLITE_PATH = SCRATCH / "dumbwaiter-sqlite.db"
#: four slashes: an absolute path (``sqlite:///rel.db`` would be relative)
SQLITE_URL = f"sqlite:///{SQLITE_PATH}"


def _app(url: str) -> tuple[dw.App, dict[str, dw.Task]]:
    """An App on ``url`` with the harness' two tasks, by the names the runner uses."""
    app = dw.App(url)
    return app, {
        "noop": app.task(name="noop")(tasks.anoop),
        "sleep10ms": app.task(name="sleep10ms")(tasks.asleep10ms),
    }


# Worker side: ``dumbwaiter worker --app dumbwaiter_adapter:sqlite_app``.
# Creating an App opens nothing (no file, no thread) until first use.
sqlite_app, SQLITE_TASKS = _app(SQLITE_URL)


class DumbwaiterAdapter(Adapter):
    """What every dumbwaiter broker shares: sync producer API, one worker process."""

    dists = ("dumbwaiter", "orjson")
    is_async = False
    default_concurrency = 32  # `dumbwaiter worker` default (-c 32)
    bulk = "batch"
    bulk_api = "task.enqueue_many(ids) (one transaction)"

    def __init__(self, name: str, backend: str, url: str, app_attr: str) -> None:
        self.name = name
        self.backend = backend
        self.url = url
        #: module attribute holding this broker's App, for the worker's --app
        self.app_attr = app_attr
        self._app: dw.App | None = None
        self._tasks: dict[str, dw.Task] = {}

    # -- producer side ---------------------------------------------------------
    def open(self) -> None:
        # A fresh App per run, not the module-level one: reset() deletes the
        # broker's state between runs, and a fresh App has no cached
        # connection or schema flag that could outlive it.  Not timed.
        self._app, self._tasks = _app(self.url)

    def close(self) -> None:
        if self._app is not None:
            self._app.close()
            self._app, self._tasks = None, {}

    def enqueue_one(self, task: str, i: int) -> None:
        self._tasks[task].enqueue(i)

    def enqueue_bulk(self, task: str, ids: range) -> None:
        self._tasks[task].enqueue_many(ids)

    # -- worker side -----------------------------------------------------------
    def worker_cmd(self, concurrency: int) -> list[str]:
        return [
            self.exe("dumbwaiter"),
            "worker",
            "--app",
            f"{__name__}:{self.app_attr}",
            "-q",
            "default",
            "-c",
            str(concurrency),
            "--log-level",
            "WARNING",
        ]


class AsyncDumbwaiterAdapter(DumbwaiterAdapter):
    """An async producer (``await task.aenqueue(i)``), for brokers whose
    client is asyncio-only (NATS, Kafka): the sync ``task.enqueue`` would
    reach them through the App's portal thread, one thread hop per call,
    while the peers and the bare-client anchors there are awaited on the
    runner's loop.  The worker is named by this adapter's own module."""

    is_async = True

    async def open(self) -> None:  # type: ignore[override]
        # Producer-side connections (and a broker's streams or topics) are
        # set up here (not timed).
        self._app, self._tasks = _app(self.url)
        await self._app.broker.open()

    async def close(self) -> None:  # type: ignore[override]
        if self._app is not None:
            await self._app.aclose()
            self._app, self._tasks = None, {}

    async def enqueue_one(self, task: str, i: int) -> None:  # type: ignore[override]
        await self._tasks[task].aenqueue(i)

    async def enqueue_bulk(self, task: str, ids: range) -> None:  # type: ignore[override]
        await self._tasks[task].aenqueue_many(ids)

    def worker_cmd(self, concurrency: int) -> list[str]:
        # the base class names its own module in --app; the App is defined
        # in the subclass's
        cmd = super().worker_cmd(concurrency)
        cmd[cmd.index("--app") + 1] = f"{type(self).__module__}:{self.app_attr}"
        return cmd


class DumbwaiterSQLiteAdapter(DumbwaiterAdapter):
    """The embedded broker: one database file in WAL mode, no server."""

    notes = (
        "SQLite database file in WAL mode on local disk, no server; producer commits with "
        "synchronous=FULL (one fsync per enqueue transaction), worker commits with NORMAL."
    )

    def __init__(self, path: Path, app_attr: str) -> None:
        # backend: the harness knows redis/postgres/rabbitmq/nats only.  Any of
        # those would make `peers.servers` check a server dumbwaiter does not
        # use and put that server's client under the report's "÷ bare client"
        # column.  "sqlite" says what the queue is; the harness accepts it
        # (servers.py prints "no readiness check ... not checked" and goes on;
        # run_all.sh checks Redis and Postgres anyway, for the limits).  Its
        # one cost: report.py falls back to the redis-py LPUSH anchor for an
        # unknown backend, so the "÷ bare client" cell of this row is divided
        # by Redis, not SQLite; docs/benchmarks.md divides by the SQLite
        # limits of the same run instead.
        super().__init__("dumbwaiter-sqlite", "sqlite", f"sqlite:///{path}", app_attr)
        self.path = path

    def _files(self) -> list[Path]:
        return [Path(f"{self.path}{suffix}") for suffix in ("", "-wal", "-shm")]

    def reset(self) -> None:
        # The runner calls this before and after each run, when no worker of
        # this run is alive (it was stopped and reaped) and close() has
        # closed the producer's connections: deleting the files is the reset.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for f in self._files():
            f.unlink(missing_ok=True)

    def pending(self) -> int | None:
        if not self.path.exists():
            return 0
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            row = conn.execute("SELECT count(*) FROM dw_jobs WHERE state='ready'").fetchone()
        except sqlite3.OperationalError:  # no schema yet: nothing was enqueued
            return 0
        finally:
            conn.close()
        return int(row[0])


ADAPTERS: list[Adapter] = [DumbwaiterSQLiteAdapter(SQLITE_PATH, "sqlite_app")]
