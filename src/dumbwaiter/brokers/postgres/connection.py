"""The PostgreSQL broker's connections, which every part of it shares.

* The **sync** pool (``psycopg_pool.ConnectionPool``) serves ``enqueue_sync``:
  sync producers in any thread borrow a connection without an event-loop hop.
* The **async** side keeps one ``LoopState`` per event loop, through the
  shared ``PerLoop`` registry (perloop.py): two small pools (pool.py) and a
  ``LISTEN`` connection that wakes idle fetches (listen.py; while it is down,
  fetches poll).  One broker object is used from several loops: the
  worker's, the App's portal thread (``job.status()`` from sync code), and a
  fresh loop per ``asyncio.run`` in the CLI and in tests.
* The schema version is checked on the first connection (and the pending
  migrations applied with ``?migrate=auto``); ``migrate`` applies them.

``PostgresConnection`` holds this and the URL's options; the parts of the
broker (enqueue.py, transport.py, admin.py, coordination.py) are mixins on
it, and broker.py puts them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import BrokerError
from .. import deadline, failure
from ..base import Broker
from ..clock import ServerClock
from ..perloop import PerLoop
from ..types import Delivery
from . import migrations
from .listen import Listener
from .options import Options, parse_url
from .pool import KeptAsyncConnection, LoopPool, check_sync, finish, recording
from .queries import Queries

#: the server's wall clock now (``now()`` is the transaction's start)
SERVER_TIME = b"SELECT extract(epoch FROM clock_timestamp())::float8"

#: transaction states a connection must not go back to the pool in
_LEFT_OPEN = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
T = TypeVar("T")

#: the server's reason for refusing a connection, in libpq's message
_FATAL = re.compile(r"FATAL:\s+(.+)")
#: reasons that are about who connects: the role, its password, pg_hba.conf
_AUTH = ("password authentication failed", "no pg_hba.conf entry", "permission denied")


class LoopState:
    """The async connections of one event loop.

    ``pool`` serves enqueues, admin, locks and the key-value store: every
    commit is flushed to disk before it returns.  ``work`` serves a worker's
    own transitions (claim, ack, retry, dead, requeue, heartbeat, rescue,
    prune) with ``synchronous_commit`` as the URL's ``worker_sync_commit``
    (``off`` by default): the server's crash can then undo the last few
    hundred milliseconds of them, which only makes those jobs run again
    (their claim or outcome is rolled back, the job never disappears), and it
    saves a disk flush per batch.  The SQLite broker makes the same trade.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pool: LoopPool,
        work: LoopPool,
        listener: Listener,
    ):
        self.loop = loop
        self.pool = pool
        self.work = work
        self.listener = listener
        #: claims whose fetch was cancelled mid-flight, being given back
        self.giving_back: set[asyncio.Task[None]] = set()
        #: acks waiting to travel with the next claim (transport.py: ack, _claim)
        self.acks_on_claim: list[AckOnClaim] = []
        #: claims started on this loop that have not yet sent their first statement
        self.boarding = 0
        #: the last idle-capable claim of this loop found jobs: the worker is
        #: busy, so its next fetch claims plainly first (transport.py: fetch)
        self.busy = False


class AckOnClaim:
    """A batch of acks travelling with a claim: one statement settles the
    worker's finished jobs and claims its next ones (a round trip and a send
    fewer per batch).  ``done`` is True once acked, False if no claim took it
    (the ack then goes alone)."""

    __slots__ = ("done", "ds")

    def __init__(self, ds: Sequence[Delivery], done: asyncio.Future[bool]) -> None:
        self.ds = ds
        self.done = done


class PostgresConnection(Broker):
    """What the parts of the PostgreSQL broker share (see the module docstring)."""

    client_errors: ClassVar[tuple[type[BaseException], ...]] = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.opts: Options = parse_url(url)
        self.schema = self.opts.schema
        self.retention = self.opts.retention
        self.q = Queries(self.schema)
        self._lock = threading.Lock()
        self._loops: PerLoop[LoopState] = PerLoop(self._new_loop, _close_loop, _abandon_loop)
        self._sync_pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pid = os.getpid()
        self._schema_ok = False
        self._known_queues: set[str] = set()
        #: queue -> monotonic time until which single enqueues skip the
        #: handoff (the last offer found no free waiter; see enqueue._statement)
        self._no_waiter: dict[str, float] = {}
        #: this broker's name as a candidate maintenance leader
        self._owner = f"{os.getpid()}:{secrets.token_hex(4)}"
        self._next_prune = 0.0
        self._prune_behind = False
        #: the server's clock: leases compare on ``now()`` in SQL, and the run
        #: times a host gives (an eta, a retry's) are moved onto it
        self.clock = ServerClock()
        #: why the sync pool's last connect failed (None: it succeeded)
        self._pool_error: BaseException | None = None

    def __repr__(self) -> str:
        return f"<PostgresBroker schema={self.schema!r}>"

    def failure(self, exc: BaseException, waited: float | None = None) -> BrokerError:
        """psycopg's ``exc`` as the ``BrokerError`` it means: the server refusing
        the URL (an unknown role or database, a wrong password: for good), the
        server out of reach (for now; a pool timeout says why the pool could
        not connect), or a failed statement."""
        cause = exc
        if isinstance(exc, PoolTimeout) and self._pool_error is not None:
            cause = self._pool_error
        refused = refusal(cause)
        if refused is not None:
            return failure.refused(self.url, refused[0], auth=refused[1])
        if unreachable(cause):
            return failure.unavailable(self.url, cause, waited)
        return failure.failed(self.url, exc)

    # -- connections -------------------------------------------------------

    def _conn_kwargs(self) -> dict[str, Any]:
        return {"autocommit": True, "prepare_threshold": self.opts.prepare_threshold}

    def _connect_timeout(self) -> dict[str, Any]:
        """A producer call's connect waits no longer than its deadline (libpq
        counts whole seconds, 2 at least); other connects take psycopg's."""
        until = deadline.current()
        if until is None:
            return {}
        return {"connect_timeout": max(2, math.ceil(until - time.monotonic()))}

    async def _aconnect(self) -> psycopg.AsyncConnection[Any]:
        conn = await KeptAsyncConnection.connect(
            self.opts.conninfo, **self._conn_kwargs(), **self._connect_timeout()
        )
        if not self._schema_ok:
            try:
                await self._acheck_schema(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def _aconnect_work(self) -> psycopg.AsyncConnection[Any]:
        conn = await self._aconnect()
        if self.opts.worker_sync_commit != "on":
            try:
                await conn.execute(
                    sql.SQL("SET synchronous_commit = {}").format(
                        sql.Literal(self.opts.worker_sync_commit)
                    )
                )
            except BaseException:  # cancelled (a stopping worker) or failed: not leaked
                finish(conn)
                raise
        return conn

    async def _acheck_schema(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._judge_schema(await migrations.aapplied_versions(conn, self.schema))
        if not self._schema_ok:  # migrate=auto and behind
            await asyncio.to_thread(self.migrate)
            self._schema_ok = True

    def _check_schema_sync(self, conn: psycopg.Connection[Any]) -> None:
        self._judge_schema(migrations.applied_versions(conn, self.schema))
        if not self._schema_ok:
            self.migrate()
            self._schema_ok = True

    def _judge_schema(self, applied: set[int]) -> None:
        if migrations.unknown(applied):
            raise migrations.too_new(self.schema, applied)
        if not migrations.pending(applied):
            self._schema_ok = True
        elif self.opts.migrate != "auto":
            raise migrations.too_old(self.schema, applied)

    def migrate(self, dry_run: bool = False) -> list[migrations.Migration]:
        """Apply the pending migrations in one transaction; return them.

        Concurrent migrators of the same schema wait for each other (an
        advisory lock), so many workers started with ``?migrate=auto`` at once
        apply each migration once."""
        with psycopg.connect(self.opts.conninfo, autocommit=True) as conn, conn.transaction():
            conn.execute(migrations.lock_query(self.schema))
            applied = migrations.applied_versions(conn, self.schema)
            if migrations.unknown(applied):
                raise migrations.too_new(self.schema, applied)
            pending = migrations.pending(applied)
            if dry_run:
                return pending
            for m in pending:
                conn.execute(migrations.prelude(self.schema))
                conn.execute(m.sql.encode())
        self._schema_ok = True
        return pending

    def schema_version(self) -> int:
        """The version recorded in the database (0: no dumbwaiter tables)."""
        with psycopg.connect(self.opts.conninfo, autocommit=True) as conn:
            return migrations.current_version(conn, self.schema)

    def _state(self) -> LoopState:
        """This event loop's connections, made on first use."""
        return self._loops.get()

    def _new_loop(self, loop: asyncio.AbstractEventLoop) -> LoopState:
        listener = Listener(self.q.channel, self._aconnect)
        st = LoopState(
            loop,
            LoopPool(self._aconnect, self.opts.pool_max),
            LoopPool(self._aconnect_work, self.opts.pool_max),
            listener,
        )
        listener.give_back = lambda ds: self._give_back(st, ds)
        return st

    def _give_back(self, st: LoopState, ds: list[Delivery]) -> None:
        """Requeue ``ds`` (uncharged) in the background; ``close`` waits for it."""
        back = st.loop.create_task(self.requeue(ds))
        st.giving_back.add(back)
        back.add_done_callback(st.giving_back.discard)

    async def _settle(self) -> None:
        """Before this loop's connections close: what the transport still
        holds for nobody (transport.py: handed jobs) goes back."""

    def _after_fork(self) -> None:
        """A forked child must not use (or close) its parent's sync pool (the
        loops' connections: ``PerLoop`` forgets them)."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._sync_pool = None

    async def _run(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        retry: bool = True,
        work: bool = False,
    ) -> T:
        """``fn`` on a pooled connection (of the worker pool if ``work``).  If
        the connection turns out dead (the server restarted, or ended our
        session), an idempotent ``fn`` is run once more on a fresh one."""
        st = self._state()
        pool = st.work if work else st.pool
        try:
            async with pool.connection() as conn:
                return await fn(conn)
        except psycopg.OperationalError:
            if not retry:
                raise
        async with pool.connection() as conn:
            return await fn(conn)

    async def _read_clock(self) -> None:
        """Read the server's clock when due (``clock.py``)."""
        await self.clock.sync(self._server_time)

    async def server_time(self) -> float | None:
        return await self._server_time()

    async def _server_time(self) -> float:
        async def read(c: psycopg.AsyncConnection[Any]) -> float:
            row = await (await c.execute(SERVER_TIME)).fetchone()
            assert row is not None
            return float(row[0])

        return await self._run(read)

    def _read_clock_blocking(self) -> None:
        def read() -> float:
            with self._sync().connection() as c:
                row = c.execute(SERVER_TIME).fetchone()
            assert row is not None
            return float(row[0])

        self.clock.sync_blocking(read)

    def _sync(self) -> ConnectionPool[psycopg.Connection[Any]]:
        pool = self._sync_pool
        if pool is not None and os.getpid() == self._pid:
            return pool
        with self._lock:
            self._after_fork()
            if self._sync_pool is None:
                self._reach_sync()
                pool = self._new_sync_pool()
                # Wait for the pool's first connections (the server was just
                # reached): a first caller that found it empty would make the
                # pool open one more, and psycopg_pool hands out its idle
                # connections in turn, so a producer calling from one thread
                # would then alternate between two server processes, each
                # woken from a longer sleep, for every call
                # (docs/benchmarks-postgres.md, issue 25).  Not ready in time:
                # a pool that connects in the background, as before.
                try:
                    pool.wait(max(0.001, deadline.remaining(self.opts.reconnect)))
                except PoolTimeout:  # wait() closed that pool
                    pool = self._new_sync_pool()
                self._sync_pool = pool
            return self._sync_pool

    def _new_sync_pool(self) -> ConnectionPool[psycopg.Connection[Any]]:
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self.opts.conninfo,
            connection_class=recording(self._pool_connected),
            min_size=self.opts.pool_min,
            max_size=self.opts.sync_pool_max,
            kwargs=self._conn_kwargs(),
            check=check_sync,
            # a server that stays down fails the call after this long
            timeout=self.opts.reconnect,
            open=False,
            name=f"dumbwaiter-{self.schema}",
        )
        pool.open(wait=False)
        return pool

    def _pool_connected(self, exc: BaseException | None) -> None:
        self._pool_error = exc

    def _reach_sync(self) -> None:
        """Connect once in the caller's thread before the sync pool exists
        (the pool connects in its own threads, where a refusal would only be
        logged): a server that refuses the URL fails the first call at once
        with its reason; one that is away is tried again until the deadline."""
        backoff: deadline.Backoff | None = None
        while True:
            timeout = max(2, math.ceil(deadline.remaining(self.opts.reconnect)))
            try:
                with psycopg.connect(
                    self.opts.conninfo, **self._conn_kwargs(), connect_timeout=timeout
                ) as conn:
                    if not self._schema_ok:
                        self._check_schema_sync(conn)
                return
            except psycopg.OperationalError as exc:
                backoff = backoff or deadline.Backoff(self.opts.reconnect)
                pause = None if refusal(exc) else backoff.pause()
                if pause is None:
                    raise self.failure(exc, backoff.waited) from exc
                time.sleep(pause)

    @contextlib.contextmanager
    def borrow(self) -> Iterator[psycopg.Connection[Any]]:
        """A sync producer's connection from the pool, waited for no longer
        than the producer's deadline (or the URL's ``reconnect``)."""
        pool = self._sync()
        conn = pool.getconn(max(0.001, deadline.remaining(self.opts.reconnect)))
        try:
            yield conn
        finally:
            self._return_sync(pool, conn)

    def with_sync(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn`` on a connection of ``borrow()``, without the context
        managers: a one-at-a-time producer makes this call every time, and
        ``borrow`` in ``ConnectionPool.connection`` (two generators and an
        autocommit connection's no-op commit) cost it more than the pool's
        own ``getconn`` and ``putconn`` (docs/benchmarks-postgres.md)."""
        pool = self._sync()
        conn = pool.getconn(max(0.001, deadline.remaining(self.opts.reconnect)))
        try:
            return fn(conn)
        finally:
            self._return_sync(pool, conn)

    @staticmethod
    def _return_sync(
        pool: ConnectionPool[psycopg.Connection[Any]], conn: psycopg.Connection[Any]
    ) -> None:
        """Back to the pool; a transaction an error left open is rolled back
        here, quietly (the pool would do it with a warning), and a broken
        connection is closed by the pool."""
        if conn.pgconn.transaction_status in _LEFT_OPEN and not conn.broken:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
        pool.putconn(conn)

    def open_sync(self) -> None:
        """Open the sync producers' pool now and check the schema (an app's
        start-up), so that the first ``enqueue`` does not pay for connecting."""
        with self.borrow() as conn:
            if not self._schema_ok:
                self._check_schema_sync(conn)

    # -- open, close ---------------------------------------------

    async def open(self) -> None:
        self._state()
        await self._run(_noop)

    async def close(self) -> None:
        await self._settle()
        with self._lock:
            pool, self._sync_pool = self._sync_pool, None
        # each loop's connections close on their own loop (perloop.py)
        await self._loops.close()
        if pool is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pool.close()
            else:
                await asyncio.to_thread(pool.close)


async def _noop(conn: psycopg.AsyncConnection[Any]) -> None:
    return None


async def _close_loop(st: LoopState) -> None:
    """Close one loop's connections, on that loop."""
    await st.listener.close()
    await asyncio.gather(*st.giving_back, return_exceptions=True)
    await st.pool.close()
    await st.work.close()


def _abandon_loop(st: LoopState) -> None:
    """Let go of the connections of a loop that cannot run them any more."""
    st.listener.abandon()
    st.pool.abandon()
    st.work.abandon()


def refusal(exc: BaseException) -> tuple[str, bool] | None:
    """``(reason, about credentials)`` when ``exc`` is the server refusing a
    connection for good: an unknown role, a wrong password, a database that
    does not exist.  None for anything a retry may mend (refused or lost
    connections, a server starting up or shutting down, too many clients).

    libpq gives no SQLSTATE for a failed connect, only the server's message:
    these are PostgreSQL's own English texts (``lc_messages`` in another
    language makes every refusal look transient: retried until the deadline,
    then reported with the server's message, as before)."""
    errors = psycopg.errors
    if isinstance(exc, errors.InvalidAuthorizationSpecification | errors.InvalidPassword):
        return str(exc), True
    if isinstance(exc, errors.InvalidCatalogName):
        return str(exc), False
    if not isinstance(exc, psycopg.OperationalError):
        return None
    m = _FATAL.search(str(exc))
    if m is None:
        return None
    reason = m.group(1).strip()
    if (reason.startswith('role "') and reason.endswith("does not exist")) or any(
        a in reason for a in _AUTH
    ):
        return reason, True
    if reason.startswith('database "') and reason.endswith("does not exist"):
        return reason, False
    return None


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server cannot be reached now (no connection,
    a lost one, a server starting or shutting down, no free slot), rather
    than that a statement failed."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P")) or state == "53300"
