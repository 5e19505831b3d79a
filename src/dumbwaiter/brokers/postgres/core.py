"""The PostgreSQL broker's connections: URL, pools per event loop, schema check.

``PostgresCore`` holds what every part of the broker shares: the options of
the URL, the sync producers' pool, one ``_LoopState`` per event loop (two
small pools and a LISTEN connection), the schema version check and
``migrate``.  ``admin.PostgresAdmin`` adds the admin, coordination and
key-value parts; ``broker.PostgresBroker`` the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from ... import keys
from ...errors import BrokerError
from .. import deadline, failure
from ..base import Binding, Broker, Delivery
from . import migrations
from .connection import LoopPool, Options, check_sync, parse_url, recording, refusal, unreachable
from .connection import _finish as finish
from .listen import Listener
from .queries import Queries

T = TypeVar("T")

#: name of the lock whose holder prunes finished jobs (one leader at a time)
MAINTENANCE_LOCK = keys.MAINTENANCE_LOCK
#: rows one prune statement deletes, and at most per round: a leader that
#: falls behind prunes again at its next rescue (each second), not a round later
PRUNE_BATCH = 5000
PRUNE_ROUND = 100_000
#: batches of at least this many jobs are written with COPY
COPY_MIN = 64


class _LoopState:
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
        #: acks waiting to travel with the next claim (broker.ack, broker._claim)
        self.riders: list[Ride] = []
        #: claims started on this loop that have not yet sent their first statement
        self.boarding = 0
        #: the last idle-capable claim of this loop found jobs: the worker is
        #: busy, so its next fetch claims plainly first (broker.fetch)
        self.busy = False


class Ride:
    """A batch of acks travelling with a claim: one statement settles the
    worker's finished jobs and claims its next ones (a round trip and a send
    fewer per batch).  ``done`` is True once acked, False if no claim took it
    (the ack then goes alone)."""

    __slots__ = ("done", "ds")

    def __init__(self, ds: Sequence[Delivery], done: asyncio.Future[bool]) -> None:
        self.ds = ds
        self.done = done


class PostgresCore(Broker):
    """What the parts of the PostgreSQL broker share (see the module docstring)."""

    client_errors: ClassVar[tuple[type[BaseException], ...]] = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.opts: Options = parse_url(url)
        self.schema = self.opts.schema
        self.retention = self.opts.retention
        self.q = Queries(self.schema)
        self._lock = threading.Lock()
        self._states: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._sync_pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pid = os.getpid()
        self._schema_ok = False
        self._known_queues: set[str] = set()
        #: queue -> monotonic time until which single enqueues skip the
        #: handoff (the last offer found no free waiter; see broker._statement)
        self._no_waiter: dict[str, float] = {}
        #: this broker's name as a candidate maintenance leader
        self._owner = f"{os.getpid()}:{secrets.token_hex(4)}"
        self._next_prune = 0.0
        self._prune_behind = False
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
        conn = await psycopg.AsyncConnection.connect(
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

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        st = self._states.get(loop)
        if st is not None and self._pid == os.getpid():
            return st
        with self._lock:
            self._after_fork()
            for other in [s for lp, s in self._states.items() if lp.is_closed()]:
                # asyncio.run() ended that loop (and cancelled its tasks)
                other.pool.abandon()
                other.work.abandon()
                other.listener.abandon()
                del self._states[other.loop]
            listener = Listener(self.q.channel, self._aconnect)
            st = _LoopState(
                loop,
                LoopPool(self._aconnect, self.opts.pool_max),
                LoopPool(self._aconnect_work, self.opts.pool_max),
                listener,
            )
            listener.give_back = lambda ds: self._give_back(st, ds)
            self._states[loop] = st
        return st

    def _give_back(self, st: _LoopState, ds: list[Delivery]) -> None:
        """Requeue ``ds`` (uncharged) in the background; ``close`` waits for it."""
        back = st.loop.create_task(self.requeue(ds))
        st.giving_back.add(back)
        back.add_done_callback(st.giving_back.discard)

    async def _settle(self) -> None:
        """Before this loop's connections close: what the transport still
        holds for nobody (broker.py: handed jobs) goes back."""

    def _after_fork(self) -> None:
        """A forked child must not use (or close) its parent's connections."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._states = {}
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

    def _sync(self) -> ConnectionPool[psycopg.Connection[Any]]:
        pool = self._sync_pool
        if pool is not None and os.getpid() == self._pid:
            return pool
        with self._lock:
            self._after_fork()
            if self._sync_pool is None:
                self._reach_sync()
                pool = ConnectionPool(
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
                self._sync_pool = pool
            return self._sync_pool

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
        timeout = max(0.001, deadline.remaining(self.opts.reconnect))
        with self._sync().connection(timeout=timeout) as conn:
            yield conn

    def open_sync(self) -> None:
        """Open the sync producers' pool now and check the schema (an app's
        start-up), so that the first ``enqueue`` does not pay for connecting."""
        with self.borrow() as conn:
            if not self._schema_ok:
                self._check_schema_sync(conn)

    # -- transport -------------------------------------------------------

    async def open(self) -> None:
        self._state()
        await self._run(_noop)

    async def close(self) -> None:
        await self._settle()
        with self._lock:
            states, self._states = self._states, {}
            pool, self._sync_pool = self._sync_pool, None
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        elsewhere: list[asyncio.Future[None]] = []
        for loop, st in states.items():
            if loop is current:
                await _close_state(st)
            elif loop.is_closed() or not loop.is_running():
                st.listener.abandon()
                st.pool.abandon()
                st.work.abandon()
            else:  # another thread's running loop: it closes its own
                cf = asyncio.run_coroutine_threadsafe(_close_state(st), loop)
                elsewhere.append(asyncio.wrap_future(cf))
        if elsewhere:
            # waited for, not just scheduled: the caller may stop that loop
            # next (``App.aclose`` stops the portal's), and a close that never
            # ran would leave its connections open
            await asyncio.wait(elsewhere, timeout=CLOSE_ELSEWHERE)
        if pool is not None:
            if current is not None:
                await asyncio.to_thread(pool.close)
            else:
                pool.close()

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        new = sorted({*queues, *(b.queue for b in bindings)} - self._known_queues)
        if new:
            await self._run(lambda c: c.execute(self.q.add_queues, (new,)))
            self._known_queues.update(new)
        if bindings:
            params = (
                [b.pattern for b in bindings],
                [b.queue for b in bindings],
                [b.max_attempts for b in bindings],
            )
            await self._run(lambda c: c.execute(self.q.bind, params))


async def _noop(conn: psycopg.AsyncConnection[Any]) -> None:
    return None


#: seconds ``close`` waits for another thread's loop to close its connections
CLOSE_ELSEWHERE = 5.0


async def _close_state(st: _LoopState) -> None:
    """Close one loop's connections, on that loop."""
    await st.listener.close()
    await asyncio.gather(*st.giving_back, return_exceptions=True)
    await st.pool.close()
    await st.work.close()
