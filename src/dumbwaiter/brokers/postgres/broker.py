"""``postgresql://`` (or ``postgres://``): the PostgreSQL broker.

* **Claims** are one ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED
  LIMIT n)``: any number of workers claim disjoint batches without waiting
  for each other.  Due scheduled jobs (eta, retries) are promoted to ready in
  the same round trip (a pipeline), just before the claim.
* **Leases** carry a fencing token; every later change of a running job
  (ack, retry, dead, requeue, extend) presents it, so a worker that lost its
  lease cannot settle a job someone else now holds.
* **Idle fetches** wait on ``LISTEN``; whatever makes a job ready sends
  ``NOTIFY`` in its own transaction.  While LISTEN is down they poll.
* **Completions** are one statement per batch (``UPDATE ... FROM unnest``).
* **Finished rows** stay in ``dw_jobs`` for the retention window (results,
  ``job.status()``, unique keys) and are then pruned; the states a worker
  polls each have a partial index, so a claim reads live rows only.
* **Maintenance**: every worker calls ``rescue`` each second (an index probe
  when nothing expired); pruning runs on one elected leader (``acquire``).

Enqueue is idempotent (a stored id or a held key is not stored again), so a
producer whose connection dies mid-call retries with backoff and can never
store a job twice.  See docs/postgres.md.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import orjson
import psycopg
from psycopg import sql
from psycopg.adapt import PyFormat
from psycopg.copy import QueuedLibpqWriter
from psycopg_pool import ConnectionPool

from ...errors import MessageDecodeError
from ...message import ErrorRecord, Message, decode, encode_checked, uuid7
from ...message import from_dict as message_from_dict
from ...state import State
from ..base import (
    Binding,
    Broker,
    Capabilities,
    Delivery,
    JobFilter,
    JobInfo,
    Page,
    QueueStats,
    delivery_of,
    normalize_error_type,
)
from . import migrations
from .connection import LoopPool, Options, check_sync, looks_closed, parse_url
from .listen import Listener
from .queries import LEASE_EXPIRED, Queries

T = TypeVar("T")

#: name of the lock whose holder prunes finished jobs (one leader at a time)
MAINTENANCE_LOCK = "dumbwaiter:maintenance"
#: rows one prune statement deletes, and at most per round: a leader that
#: falls behind prunes again at its next rescue (each second), not a round later
PRUNE_BATCH = 5000
PRUNE_ROUND = 100_000
#: batches of at least this many jobs are written with COPY
COPY_MIN = 64
#: field names of a stored row (see PostgresBroker._row), as query parameters
_ROW_FIELDS = ("id", "queue", "name", "kind", "priority", "max_attempts", "key", "body", "eta")
#: the cursor of a first page of events
_NIL_UUID = "00000000-0000-0000-0000-000000000000"
#: how long a producer keeps retrying an enqueue while the server is unreachable
RECONNECT_FOR = 15.0


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


class PostgresBroker(Broker):
    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True, transactional_outbox=True, multi_process=True, events=True
    )
    schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")

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
        #: this broker's name as a candidate maintenance leader
        self._owner = f"{os.getpid()}:{secrets.token_hex(4)}"
        self._next_prune = 0.0
        self._prune_behind = False

    def __repr__(self) -> str:
        return f"<PostgresBroker schema={self.schema!r}>"

    # -- connections -------------------------------------------------------

    def _conn_kwargs(self) -> dict[str, Any]:
        return {"autocommit": True, "prepare_threshold": self.opts.prepare_threshold}

    async def _aconnect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(self.opts.conninfo, **self._conn_kwargs())
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
            await conn.execute(
                sql.SQL("SET synchronous_commit = {}").format(
                    sql.Literal(self.opts.worker_sync_commit)
                )
            )
        return conn

    async def _acheck_schema(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._judge_schema(await migrations.acurrent_version(conn, self.schema))
        if not self._schema_ok:  # migrate=auto and behind
            await asyncio.to_thread(self.migrate)
            self._schema_ok = True

    def _check_schema_sync(self, conn: psycopg.Connection[Any]) -> None:
        self._judge_schema(migrations.current_version(conn, self.schema))
        if not self._schema_ok:
            self.migrate()
            self._schema_ok = True

    def _judge_schema(self, found: int) -> None:
        if found > migrations.SCHEMA_VERSION:
            raise migrations.too_new(self.schema, found)
        if found == migrations.SCHEMA_VERSION:
            self._schema_ok = True
        elif self.opts.migrate != "auto":
            raise migrations.too_old(self.schema, found)

    def migrate(self, dry_run: bool = False) -> list[migrations.Migration]:
        """Apply the pending migrations in one transaction; return them.

        Concurrent migrators of the same schema wait for each other (an
        advisory lock), so many workers started with ``?migrate=auto`` at once
        apply each migration once."""
        with psycopg.connect(self.opts.conninfo, autocommit=True) as conn, conn.transaction():
            conn.execute(migrations.lock_query(self.schema))
            current = migrations.current_version(conn, self.schema)
            if current > migrations.SCHEMA_VERSION:
                raise migrations.too_new(self.schema, current)
            pending = [m for m in migrations.migrations() if m.version > current]
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
            st = _LoopState(
                loop,
                LoopPool(self._aconnect, self.opts.pool_max),
                LoopPool(self._aconnect_work, self.opts.pool_max),
                Listener(self.q.channel, self._aconnect),
            )
            self._states[loop] = st
        return st

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
                pool = ConnectionPool(
                    self.opts.conninfo,
                    min_size=1,
                    max_size=self.opts.sync_pool_max,
                    kwargs=self._conn_kwargs(),
                    check=check_sync,
                    # a server that stays down fails the call after this long
                    timeout=RECONNECT_FOR,
                    open=False,
                    name=f"dumbwaiter-{self.schema}",
                )
                pool.open(wait=False)
                self._sync_pool = pool
            return self._sync_pool

    def open_sync(self) -> None:
        """Open the sync producers' pool now and check the schema (an app's
        start-up), so that the first ``enqueue`` does not pay for connecting."""
        with self._sync().connection() as conn:
            if not self._schema_ok:
                self._check_schema_sync(conn)

    # -- transport -------------------------------------------------------

    async def open(self) -> None:
        self._state()
        await self._run(_noop)

    async def close(self) -> None:
        with self._lock:
            states, self._states = self._states, {}
            pool, self._sync_pool = self._sync_pool, None
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, st in states.items():
            if loop is current:
                await st.listener.close()
                await asyncio.gather(*st.giving_back, return_exceptions=True)
                await st.pool.close()
                await st.work.close()
            elif loop.is_closed() or not loop.is_running():
                st.listener.abandon()
                st.pool.abandon()
                st.work.abandon()
            else:  # another thread's running loop: let it close its own
                loop.call_soon_threadsafe(_close_later, st)
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

    # -- events ------------------------------------------------------------------
    #
    # One transaction per publish: the new events go to the log (a stored id
    # is skipped, so a relay that publishes twice delivers once), then one job
    # per bound queue, inserted like any enqueue (its NOTIFY goes out at commit).

    def _events(self, msgs: Iterable[Message]) -> tuple[list[Message], dict[str, Any]]:
        events = list(msgs)
        limit = self.max_message_size
        params = {
            "id": [m.id for m in events],
            "type": [m.name for m in events],
            "body": [encode_checked(m, limit) for m in events],
        }
        return events, params

    def _deliveries(
        self, events: list[Message], logged: set[str], bound: list[Any]
    ) -> list[tuple[Any, ...]]:
        by_type: dict[str, list[Binding]] = {}
        for pattern, queue, attempts in bound:
            by_type.setdefault(pattern, []).append(Binding(pattern, queue, attempts))
        return [
            self._row(delivery_of(m, b, uuid7()))
            for m in events
            if m.id in logged
            for b in by_type.get(m.name, ())
        ]

    async def publish(self, msgs: Iterable[Message]) -> int:
        events, params = self._events(msgs)
        if not events:
            return 0

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            async with c.transaction():
                logged = {
                    r[0] for r in await (await c.execute(self.q.log_events, params)).fetchall()
                }
                types = sorted({m.name for m in events if m.id in logged})
                bound = await (await c.execute(self.q.bindings_of, (types,))).fetchall()
                rows = self._deliveries(events, logged, bound)
                if rows:
                    await self._ainsert(c, rows)
                return len(rows)

        return await self._run(run)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        events, params = self._events(msgs)
        if not events:
            return 0
        with self._sync().connection() as c, c.transaction():
            if not self._schema_ok:
                self._check_schema_sync(c)
            logged = {r[0] for r in c.execute(self.q.log_events, params).fetchall()}
            types = sorted({m.name for m in events if m.id in logged})
            bound = c.execute(self.q.bindings_of, (types,)).fetchall()
            rows = self._deliveries(events, logged, bound)
            if rows:
                self._insert(c, rows)
            return len(rows)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        params = {
            "type": event_type,
            "after": cursor if cursor and _is_uuid(cursor) else _NIL_UUID,
            "since": since,
            "until": until,
            "limit": limit + 1,
        }

        async def run(c: psycopg.AsyncConnection[Any]) -> list[Any]:
            return await (await c.execute(self.q.list_events, params)).fetchall()

        rows = await self._run(run)
        page = [decode(bytes(body)) for _, body in rows[:limit]]
        return page, (page[-1].id if len(rows) > limit else None)

    # -- enqueue -----------------------------------------------------------------
    #
    # Three shapes of the same insert, chosen by batch size: one row (scalar
    # parameters), a few rows (arrays spread by unnest), and bulk (COPY, with
    # no per-row work on the server beyond storing it).  Each batch is one
    # transaction; its NOTIFY goes out at commit.  COPY cannot skip duplicates:
    # a batch holding a stored id or a held key fails as a whole and is stored
    # again through the insert, which skips them.  Every path is idempotent,
    # so a batch whose connection died (mid-call, or before the reply) is
    # retried with backoff for up to RECONNECT_FOR seconds.

    def _row(self, m: Message) -> tuple[Any, ...]:
        """One job as stored: (id, queue, name, kind, priority, max_attempts,
        key, body, eta).  Encoded and size-checked before any I/O."""
        return (
            m.id,
            m.queue,
            m.name,
            m.kind,
            m.priority,
            m.max_attempts,
            m.key if m.kind == "task" else None,
            encode_checked(m, self.max_message_size),
            m.eta,
        )

    def _params(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        if len(rows) == 1:
            p = dict(zip(_ROW_FIELDS, rows[0], strict=True))
        else:
            p = {f: [r[i] for r in rows] for i, f in enumerate(_ROW_FIELDS)}
        p["channel"] = self.q.channel
        return p

    def _new_queues(self, rows: Iterable[tuple[Any, ...]]) -> list[str]:
        return sorted({r[1] for r in rows} - self._known_queues)

    def _ids(self, rows: Sequence[tuple[Any, ...]], holders: dict[str, str]) -> list[str]:
        """Each row's id, or the id of the stored job that holds its key."""
        return [holders.get(r[6], r[0]) if r[6] is not None else r[0] for r in rows]

    def _holders(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        return [r[6] for r in rows if r[6] is not None]

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        it = iter(msgs)
        head = [self._row(m) for m in itertools.islice(it, COPY_MIN)]
        rows: list[tuple[Any, ...]] = head
        if len(head) == COPY_MIN:
            copied: list[tuple[Any, ...]] = []
            try:
                return await self._run(lambda c: self._acopy(c, head, it, copied), retry=False)
            except (psycopg.errors.UniqueViolation, psycopg.OperationalError):
                rows = copied  # stored again below, skipping what is stored
        if not rows:
            return []
        deadline = time.monotonic() + RECONNECT_FOR
        backoff = 0.05
        while True:
            try:
                return await self._run(lambda c: self._ainsert(c, rows))
            except psycopg.OperationalError:
                if time.monotonic() + backoff > deadline:
                    raise
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def aenqueue_in(
        self, conn: psycopg.AsyncConnection[Any], msgs: Iterable[Message]
    ) -> list[str]:
        """Enqueue on the caller's connection, inside its transaction if it has
        one (the transactional outbox): the jobs and their NOTIFY become
        visible when the caller commits, and vanish if it rolls back."""
        rows = [self._row(m) for m in msgs]
        return await self._ainsert(conn, rows) if rows else []

    async def _ainsert(
        self, conn: psycopg.AsyncConnection[Any], rows: Sequence[tuple[Any, ...]]
    ) -> list[str]:
        new_queues = self._new_queues(rows)
        if new_queues:
            await conn.execute(self.q.add_queues, (new_queues,))
        stmt = self.q.enqueue_one if len(rows) == 1 else self.q.enqueue
        row = await (await conn.execute(stmt, self._params(rows))).fetchone()
        holders: dict[str, str] = {}
        if (int(row[0]) if row else 0) < len(rows) and (keys := self._holders(rows)):
            holders = dict(await (await conn.execute(self.q.holders, (keys,))).fetchall())
        self._known_queues.update(new_queues)
        return self._ids(rows, holders)

    async def _acopy(
        self,
        conn: psycopg.AsyncConnection[Any],
        head: list[tuple[Any, ...]],
        rest: Iterator[Message],
        kept: list[tuple[Any, ...]],
    ) -> list[str]:
        now = time.time()
        later: list[tuple[Any, ...]] = []  # due in the future: not for COPY
        async with conn.transaction():
            cur = conn.cursor()
            _fast_bytea(cur)
            async with cur.copy(self.q.copy) as cp:
                cp.set_types(_COPY_TYPES)
                for r in itertools.chain(head, (self._row(m) for m in rest)):
                    kept.append(r)
                    if r[8] is not None and r[8] > now:
                        later.append(r)
                    else:
                        await cp.write_row(_binary_row(r))
            ids = [r[0] for r in kept]
            if later:
                held = await self._ainsert(conn, later)
                ids = _merge_ids(kept, later, held)
            queues = sorted({r[1] for r in kept})
            new_queues = sorted(set(queues) - self._known_queues)
            if new_queues:
                await conn.execute(self.q.add_queues, (new_queues,))
            await conn.execute(self.q.notify, (self.q.channel, queues))
        self._known_queues.update(new_queues)
        return ids

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        it = iter(msgs)
        head = [self._row(m) for m in itertools.islice(it, COPY_MIN)]
        rows: list[tuple[Any, ...]] = head
        pool = self._sync()
        if len(head) == COPY_MIN:
            copied: list[tuple[Any, ...]] = []
            try:
                with pool.connection() as conn:
                    return self._copy(conn, head, it, copied)
            except (psycopg.errors.UniqueViolation, psycopg.OperationalError):
                rows = copied
        if not rows:
            return []
        deadline = time.monotonic() + RECONNECT_FOR
        backoff = 0.05
        while True:
            try:
                with pool.connection() as conn:
                    return self._insert(conn, rows)
            except psycopg.OperationalError:
                if time.monotonic() + backoff > deadline:
                    raise
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def enqueue_in(self, conn: psycopg.Connection[Any], msgs: Iterable[Message]) -> list[str]:
        """``aenqueue_in`` for a sync psycopg connection."""
        rows = [self._row(m) for m in msgs]
        return self._insert(conn, rows) if rows else []

    def _insert(self, conn: psycopg.Connection[Any], rows: Sequence[tuple[Any, ...]]) -> list[str]:
        if not self._schema_ok:
            self._check_schema_sync(conn)
        new_queues = self._new_queues(rows)
        if new_queues:
            conn.execute(self.q.add_queues, (new_queues,))
        stmt = self.q.enqueue_one if len(rows) == 1 else self.q.enqueue
        row = conn.execute(stmt, self._params(rows)).fetchone()
        holders: dict[str, str] = {}
        if (int(row[0]) if row else 0) < len(rows) and (keys := self._holders(rows)):
            holders = dict(conn.execute(self.q.holders, (keys,)).fetchall())
        self._known_queues.update(new_queues)
        return self._ids(rows, holders)

    def _copy(
        self,
        conn: psycopg.Connection[Any],
        head: list[tuple[Any, ...]],
        rest: Iterator[Message],
        kept: list[tuple[Any, ...]],
    ) -> list[str]:
        if not self._schema_ok:
            self._check_schema_sync(conn)
        now = time.time()
        later: list[tuple[Any, ...]] = []
        with conn.transaction():
            cur = conn.cursor()
            _fast_bytea(cur)
            # the writer thread sends while this one encodes: the server stores
            # the first rows while the last ones are being made
            with cur.copy(self.q.copy, writer=QueuedLibpqWriter(cur)) as cp:
                cp.set_types(_COPY_TYPES)
                for r in itertools.chain(head, (self._row(m) for m in rest)):
                    kept.append(r)
                    if r[8] is not None and r[8] > now:
                        later.append(r)
                    else:
                        cp.write_row(_binary_row(r))
            ids = [r[0] for r in kept]
            if later:
                ids = _merge_ids(kept, later, self._insert(conn, later))
            queues = sorted({r[1] for r in kept})
            new_queues = sorted(set(queues) - self._known_queues)
            if new_queues:
                conn.execute(self.q.add_queues, (new_queues,))
            conn.execute(self.q.notify, (self.q.channel, queues))
        self._known_queues.update(new_queues)
        return ids

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0 or not queues:
            return []
        queues = list(queues)
        st = self._state()
        if wait <= 0:
            return (await self._claim_safely(st, queues, limit, lease, worker))[0]
        deadline = time.monotonic() + wait
        listener = st.listener
        if not listener.listening:  # the first wait of this loop: LISTEN first
            await listener.ready(min(wait, 1.0))
        # The waiter exists before the claim, so a NOTIFY sent after the claim's
        # snapshot is never missed; an idle pass is one round trip.
        waiter = listener.add(queues)
        try:
            while True:
                waiter.event.clear()
                out, due = await self._claim_safely(st, queues, limit, lease, worker)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0:
                    return out
                if due is not None:
                    remaining = min(remaining, max(0.0, due))
                if not listener.listening:
                    remaining = min(remaining, self.opts.poll_interval)
                await waiter.wait(remaining)
        finally:
            listener.remove(waiter)

    async def _claim_safely(
        self, st: _LoopState, queues: list[str], limit: int, lease: float, worker: str
    ) -> tuple[list[Delivery], float | None]:
        """A claim that can be cancelled: if the caller gives up while the
        claim is in flight, what it claimed is given back (uncharged)."""
        task = asyncio.ensure_future(
            self._run(
                lambda c: self._claim(c, queues, limit, lease, worker), retry=False, work=True
            )
        )
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:

            def give_back(t: asyncio.Future[tuple[list[Delivery], float | None]]) -> None:
                if t.cancelled() or t.exception() is not None or not t.result()[0]:
                    return
                back = st.loop.create_task(self.requeue(t.result()[0]))
                st.giving_back.add(back)
                back.add_done_callback(st.giving_back.discard)

            task.add_done_callback(give_back)
            raise

    async def _claim(
        self,
        conn: psycopg.AsyncConnection[Any],
        queues: list[str],
        limit: int,
        lease: float,
        worker: str,
    ) -> tuple[list[Delivery], float | None]:
        """Claim up to ``limit`` jobs; with none, also say in how many seconds
        the next scheduled job of ``queues`` is due (None: none is)."""
        token = secrets.randbits(62)
        params: dict[str, Any] = {"token": token, "lease": lease, "worker": worker, "limit": limit}
        if len(queues) == 1:
            params["queue"] = queues[0]
            claim = self.q.claim_one
        else:
            params["queues"] = queues
            claim = self.q.claim_many
        rows: list[Any] = []
        due = None
        while True:
            cur = await conn.execute(claim, params, binary=True)
            got = await cur.fetchall()
            promoted = got[0][8] if got else 0
            if got and got[0][0] is None:
                due = got[0][9]
            else:
                rows += got
            # due jobs were just promoted: the next statement can claim them
            if not promoted or len(rows) >= limit:
                break
            params["limit"] = limit - len(rows)
        if len(rows) > 1:  # RETURNING has no order: priority, then FIFO, per queue
            order = {q: i for i, q in enumerate(queues)}
            rows.sort(key=lambda r: (order.get(r[1], 0), -r[5], r[6], r[0]))
        return [_delivery(r, token) for r in rows], (None if rows else due)

    def _batch(self, ds: Sequence[Delivery]) -> dict[str, Any]:
        return {
            "id": ",".join([d.id for d in ds]),
            "token": ",".join([str(d.token) for d in ds]),
            "retention": self.retention,
            "channel": self.q.channel,
        }

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        params = self._batch(ds)
        stmt = self.q.ack
        if any(d.result is not None for d in ds):
            stmt = self.q.ack_results
            params["result"] = [d.result for d in ds]
            params["keep"] = [d.result_ttl if d.result is not None else None for d in ds]
        await self._run(lambda c: c.execute(stmt, params), work=True)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        params = self._batch(ds)
        params["at"] = [d.retry_at for d in ds]
        params["err"] = [_err_json(d) for d in ds]
        params["etype"] = [None if d.error is None else d.error.type for d in ds]
        await self._run(lambda c: c.execute(self.q.retry, params), work=True)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        params = self._batch(ds)
        params["err"] = [_err_json(d) for d in ds]
        params["etype"] = [None if d.error is None else d.error.type for d in ds]
        await self._run(lambda c: c.execute(self.q.dead, params), work=True)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if ds:
            params = self._batch(ds)
            await self._run(lambda c: c.execute(self.q.requeue, params), work=True)

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if not ds:
            return []
        params = self._batch(ds)
        params["lease"] = lease

        async def run(c: psycopg.AsyncConnection[Any]) -> dict[str, float]:
            cur = await c.execute(self.q.extend, params)
            return {i: float(u) for i, u in await cur.fetchall()}

        kept = await self._run(run, work=True)
        lost = []
        for d in ds:
            until = kept.get(d.id)
            if until is None:
                lost.append(d)
            else:
                d.lease_until = until
        return lost

    async def rescue(self) -> int:
        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            cur = await c.execute(self.q.rescue, {"type": LEASE_EXPIRED, "channel": self.q.channel})
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        n = await self._run(run, work=True)
        now = time.monotonic()
        if now >= self._next_prune:
            self._next_prune = now + self.opts.prune_interval
            if await self.maintain() and self._prune_behind:
                # more expired rows than one round deletes: again next rescue
                self._next_prune = now
        return n

    async def maintain(self) -> bool:
        """Prune finished jobs past their retention and expired kv entries, if
        this broker is (or becomes) the maintenance leader.  True if it was."""
        ttl = 3 * self.opts.prune_interval
        if await self.acquire(MAINTENANCE_LOCK, self._owner, ttl) is None:
            return False

        async def prune(c: psycopg.AsyncConnection[Any]) -> bool:
            behind = True
            for _ in range(PRUNE_ROUND // PRUNE_BATCH):  # short statements, short locks
                cur = await c.execute(self.q.prune_jobs, (PRUNE_BATCH,))
                if cur.rowcount < PRUNE_BATCH:
                    behind = False
                    break
            await c.execute(self.q.prune_kv)
            cur = await c.execute(self.q.prune_events, (self.event_retention, PRUNE_BATCH))
            return behind or cur.rowcount == PRUNE_BATCH

        self._prune_behind = await self._run(prune, work=True)
        return True

    # -- admin -----------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        async def run(c: psycopg.AsyncConnection[Any]) -> list[QueueStats]:
            queues = await (await c.execute(self.q.queues)).fetchall()
            counts = await (await c.execute(self.q.counts)).fetchall()
            return _stats(queues, counts)

        return await self._run(run)

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        where, params = _where(filter)
        if cursor is not None:
            where += " AND id < %s::uuid"
            params.append(cursor)
        query = (self.q.list_prefix + where + " ORDER BY id DESC LIMIT %s").encode()
        params.append(limit + 1)

        async def run(c: psycopg.AsyncConnection[Any]) -> list[Any]:
            return await (await c.execute(query, params)).fetchall()

        rows = await self._run(run)
        items = [_info(r) for r in rows[:limit]]
        return Page(items=items, cursor=items[-1].message.id if len(rows) > limit else None)

    async def get(self, id: str) -> JobInfo | None:
        try:
            uuid.UUID(id)
        except ValueError:
            return None

        async def run(c: psycopg.AsyncConnection[Any]) -> Any:
            return await (await c.execute(self.q.get, (id,))).fetchone()

        row = await self._run(run)
        return None if row is None else _info(row)

    async def replay(self, filter: JobFilter) -> int:
        where, params = _where(filter)
        query = (self.q.replay_prefix + where + self.q.replay_suffix).encode()
        params = [*params, self.q.channel]
        query = query.replace(b"%(channel)s", b"%s")

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            row = await (await c.execute(query, params)).fetchone()
            return int(row[0]) if row else 0

        return await self._run(run)

    async def purge(self, filter: JobFilter) -> int:
        where, params = _where(filter)
        query = (self.q.purge_prefix + where).encode()

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            return (await c.execute(query, params)).rowcount

        return await self._run(run)

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        valid = [i for i in ids if _is_uuid(i)]
        if not valid:
            return []

        async def run(c: psycopg.AsyncConnection[Any]) -> list[str]:
            cur = await c.execute(self.q.cancel, (self.retention, valid))
            return [r[0] for r in await cur.fetchall()]

        return await self._run(run)

    async def pause(self, queue: str) -> None:
        await self._set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        await self._set_paused(queue, False)

    async def _set_paused(self, queue: str, paused: bool) -> None:
        params = {"queue": queue, "paused": paused, "channel": self.q.channel}
        await self._run(lambda c: c.execute(self.q.set_paused, params))
        self._known_queues.add(queue)

    # -- coordination ------------------------------------------------------

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        params = {"name": name, "owner": owner, "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> int | None:
            row = await (await c.execute(self.q.acquire, params)).fetchone()
            return None if row is None else int(row[0])

        return await self._run(run)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        params = {"name": name, "owner": owner, "token": token, "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> bool:
            return (await c.execute(self.q.renew, params)).rowcount == 1

        return await self._run(run)

    async def release(self, name: str, owner: str, token: int) -> None:
        params = {"name": name, "owner": owner, "token": token}
        await self._run(lambda c: c.execute(self.q.release, params))

    # -- key-value ---------------------------------------------------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        async def run(c: psycopg.AsyncConnection[Any]) -> dict[str, bytes]:
            cur = await c.execute(self.q.kv_get, (list(keys),))
            return {k: bytes(v) for k, v in await cur.fetchall()}

        return await self._run(run)

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        if not items:
            return
        params = {"keys": list(items), "values": [bytes(v) for v in items.values()], "ttl": ttl}
        await self._run(lambda c: c.execute(self.q.kv_set, params))

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        params = {"key": key, "value": bytes(value), "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> bool:
            return (await (await c.execute(self.q.kv_add, params)).fetchone()) is not None

        return await self._run(run)

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        params = {"key": key, "amount": amount, "ttl": ttl}

        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            row = await (await c.execute(self.q.kv_incr, params)).fetchone()
            assert row is not None
            return int(row[0])

        # not idempotent: a retry after a lost reply could count twice
        return await self._run(run, retry=False)

    async def kv_delete(self, keys: Sequence[str]) -> int:
        async def run(c: psycopg.AsyncConnection[Any]) -> int:
            row = await (await c.execute(self.q.kv_delete, (list(keys),))).fetchone()
            return int(row[0]) if row else 0

        return await self._run(run)

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        async def run(c: psycopg.AsyncConnection[Any]) -> dict[str, bytes]:
            cur = await c.execute(self.q.kv_scan, (prefix,))
            return {k: bytes(v) for k, v in await cur.fetchall()}

        return await self._run(run)


# -- helpers ---------------------------------------------------------------------


async def _noop(conn: psycopg.AsyncConnection[Any]) -> None:
    return None


def _close_later(st: _LoopState) -> None:
    async def go() -> None:
        await st.listener.close()
        await st.pool.close()
        await st.work.close()

    st.loop.create_task(go())


#: the types psycopg writes a COPY row as (binary format).  The id goes as the
#: 16 bytes of the UUID, typed bytea here: the binary form of a uuid column is
#: those bytes, and this avoids building a uuid.UUID per job.
_COPY_TYPES = ["bytea", "text", "text", "text", "int4", "int4", "text", "bytea"]


def _fast_bytea(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """COPY picks dumpers by column type, and for bytea psycopg's lookup by type
    finds its pure-Python DB-API ``Binary`` dumper; this cursor gets the
    (C, where psycopg has it) dumper of ``bytes`` instead."""
    cur.adapters.register_dumper(bytes, cur.adapters.get_dumper(bytes, PyFormat.BINARY))


def _binary_row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    return (bytes.fromhex(r[0].replace("-", "")), r[1], r[2], r[3], r[4], r[5], r[6], r[7])


def _merge_ids(
    kept: list[tuple[Any, ...]], later: list[tuple[Any, ...]], held: list[str]
) -> list[str]:
    """The ids of a COPY batch whose scheduled rows were inserted apart."""
    by_row = {id(r): i for r, i in zip(later, held, strict=True)}
    return [by_row.get(id(r), r[0]) for r in kept]


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _message(body: bytes, queue: str, attempt: int, errors: str | None) -> Message:
    d = orjson.loads(body)
    d["queue"] = queue
    d["attempt"] = attempt
    d["errors"] = orjson.loads(errors) if errors else []
    return message_from_dict(d)


def _delivery(row: Any, token: int) -> Delivery:
    id_, queue, attempt, body, errors = row[:5]
    try:
        msg: Message | None = _message(body, queue, attempt, errors)
        problem = None
    except (orjson.JSONDecodeError, MessageDecodeError) as exc:
        msg, problem = None, str(exc)
    return Delivery(
        id=id_,
        message=msg,
        token=token,
        lease_until=row[7],
        queue=queue,
        raw=None if msg is not None else bytes(body),
        decode_error=problem,
    )


def _info(row: Any) -> JobInfo:
    (
        id_,
        queue,
        state,
        attempt,
        body,
        errors,
        run_at,
        updated_at,
        worker,
        lease,
        result,
        replays,
    ) = row
    raw = None
    try:
        msg = _message(body, queue, attempt, errors)
    except (orjson.JSONDecodeError, MessageDecodeError):
        raw = bytes(body)
        msg = Message(
            id=id_,
            kind="task",
            name="?",
            queue=queue,
            attempt=attempt,
            errors=[ErrorRecord.from_dict(e) for e in orjson.loads(errors)] if errors else [],
        )
    st = State(state)
    if st is State.SCHEDULED and attempt > 0:
        st = State.RETRYING
    return JobInfo(
        message=msg,
        state=st,
        run_at=run_at,
        updated_at=updated_at,
        worker=worker,
        lease_until=lease,
        result=None if result is None else bytes(result),
        replays=replays,
        raw=raw,
    )


def _stats(queues: list[Any], counts: list[Any]) -> list[QueueStats]:
    table: dict[str, dict[str, float]] = {name: {} for name, _ in queues}
    paused = {name for name, p in queues if p}
    for queue, state, retrying, n, age in counts:
        c = table.setdefault(queue, {})
        key = "retrying" if retrying else state
        c[key] = c.get(key, 0) + n
        if state == "ready" and age is not None:
            c["lag"] = max(c.get("lag", 0.0), float(age))
    return [
        QueueStats(
            queue=q,
            ready=int(c.get("ready", 0)),
            scheduled=int(c.get("scheduled", 0)),
            retrying=int(c.get("retrying", 0)),
            running=int(c.get("running", 0)),
            dead=int(c.get("dead", 0)),
            succeeded=int(c.get("succeeded", 0)),
            cancelled=int(c.get("cancelled", 0)),
            lag=max(0.0, c.get("lag", 0.0)),
            paused=q in paused,
        )
        for q, c in sorted(table.items())
    ]


def _err_json(d: Delivery) -> str | None:
    return None if d.error is None else orjson.dumps(d.error.to_dict()).decode()


def _where(f: JobFilter) -> tuple[str, list[Any]]:
    """SQL conditions (positional ``%s`` parameters) for an admin filter."""
    clauses = ["true"]
    params: list[Any] = []
    if f.queue is not None:
        clauses.append("queue = %s")
        params.append(f.queue)
    if f.name is not None:
        clauses.append("name = %s")
        params.append(f.name)
    if f.state is not None:
        if f.state is State.RETRYING:
            clauses.append("state = 'scheduled' AND attempt > 0")
        elif f.state is State.SCHEDULED:
            clauses.append("state = 'scheduled' AND attempt = 0")
        else:
            clauses.append("state = %s")
            params.append(str(f.state))
    if f.ids is not None:
        clauses.append("id = ANY(%s::uuid[])")
        params.append([i for i in f.ids if _is_uuid(i)])
    if f.since is not None:
        clauses.append("updated_at >= to_timestamp(%s)")
        params.append(f.since)
    if f.until is not None:
        clauses.append("updated_at <= to_timestamp(%s)")
        params.append(f.until)
    if f.error_type is not None:
        wanted = normalize_error_type(f.error_type)
        clauses.append("(last_error_type = %s OR right(last_error_type, %s) = %s)")
        params += [wanted, len(wanted) + 1, "." + wanted]
    return " AND ".join(clauses), params


__all__ = ["MAINTENANCE_LOCK", "PostgresBroker", "looks_closed"]
