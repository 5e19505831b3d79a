"""``postgresql://`` (or ``postgres://``): the PostgreSQL broker.

* **Claims** are one ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED
  LIMIT n)``: any number of workers claim disjoint batches without waiting
  for each other.  The same statement first promotes due scheduled jobs
  (eta, retries) to ready.
* **Leases** carry a fencing token; every later change of a running job
  (ack, retry, dead, requeue, extend) presents it, so a worker that lost its
  lease cannot settle a job someone else now holds.
* **Idle fetches** wait on ``LISTEN``; whatever makes a job ready sends
  ``NOTIFY`` in its own transaction.  While LISTEN is down they poll.
* **Handoff**: an idle fetch's claim also registers it as a waiter
  (``dw_waiters``); a single enqueue of a ready job stores it already
  running for a waiter of its queue and sends it in the NOTIFY, so an idle
  worker starts it without a claim's round trip (listen.py, ``fetch``).
* **Completions** are one statement per batch (``UPDATE ... FROM unnest``);
  a batch of acks made as the worker's next claim starts rides with it (one
  statement acks and claims: ``_ride``).
* **Finished rows** stay in ``dw_jobs`` for the retention window (results,
  ``job.status()``, unique keys) and are then pruned; the states a worker
  polls each have a partial index, so a claim reads live rows only.
* **Maintenance**: every worker calls ``rescue`` each second (an index probe
  when nothing expired); pruning runs on one elected leader (``acquire``).

Enqueue is idempotent (a stored id or a held key is not stored again), so a
producer whose connection dies mid-call retries with backoff and can never
store a job twice.  Connections: core.py; admin, locks, kv: admin.py.  See
docs/postgres.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import psycopg
from psycopg.copy import QueuedLibpqWriter
from psycopg.rows import tuple_row

from ...message import ErrorRecord, Message, decode, encode_checked, uuid7
from ..base import (
    Binding,
    Capabilities,
    DeadLetter,
    Delivery,
    Rescued,
    delivery_of,
)
from ..deadline import Backoff
from ..sql.rows import delivery_row, err_json, is_uuid, stored_message
from .admin import PostgresAdmin
from .connection import refusal
from .core import (
    COPY_MIN,
    MAINTENANCE_LOCK,
    PRUNE_BATCH,
    PRUNE_ROUND,
    Ride,
    _LoopState,
)
from .joined import Identity, adriver, aread_identity, check_in_transaction, driver, read_identity
from .listen import Listener, Waiter
from .queries import LEASE_EXPIRED
from .rows import NIL_UUID, ROW_FIELDS, CopyRows, merge_ids

if TYPE_CHECKING:
    from ...sqldb import Sql

#: turns of the event loop an ack waits for a claim to carry it (see ``_ride``)
RIDE_TURNS = 6
#: PostgreSQL's NOTIFY payload limit (bytes, exclusive): a handed job travels in one
NOTIFY_MAX = 8000
#: room in a handoff's payload for its header (token, id, lease end; the
#: queue's name is counted apart)
HAND_HEADER = 128
#: seconds a waiter's row is kept past its expiry before maintenance deletes it
WAITER_GRACE = 60.0
#: seconds a queue's single enqueues skip the handoff after an offer found no
#: free waiter (a backlog, a busy or no worker): its lookup costs ~0.05 ms of
#: server time per enqueue; an idle worker missed meanwhile claims as before
HAND_BACKOFF = 0.05
#: the most seconds a cancelled fetch's withdrawal waits for a handoff that
#: was in flight to it (the next fetch of the loop waits for the withdrawal)
WITHDRAW_HOLD = 1.0

log = logging.getLogger("dumbwaiter.postgres")

#: a connection (or a cursor on one) that the insert statements run on
T = TypeVar("T")
SyncConn = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncConn = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]


class PostgresBroker(PostgresAdmin):
    """The PostgreSQL broker: transport and events (the rest: admin.py, core.py)."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True,
        transactional_outbox=True,
        multi_process=True,
        multi_host=True,
        events=True,
        limits=True,
    )
    schemes: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")

    def __init__(self, url: str) -> None:
        super().__init__(url)
        #: this broker's database, as the outbox's fast path compares it
        self._identity: Identity | None = None
        #: callers' psycopg connections: whether each is to this database
        self._joined: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

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
                return await self._afan_out(c, events, params)

        # an event already in the log is not delivered again: safe to repeat
        return await self._aretrying(run)

    async def _afan_out(
        self,
        c: AsyncConn,
        events: list[Message],
        params: dict[str, Any],
        remember: bool = True,
    ) -> int:
        """Log the new events, then one job per bound queue (in ``c``'s transaction)."""
        logged = {r[0] for r in await (await c.execute(self.q.log_events, params)).fetchall()}
        types = sorted({m.name for m in events if m.id in logged})
        bound = await (await c.execute(self.q.bindings_of, (types,))).fetchall()
        rows = self._deliveries(events, logged, bound)
        if rows:
            await self._ainsert(c, rows, remember, hand=remember)
        return len(rows)

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        events, params = self._events(msgs)
        if not events:
            return 0

        def run(c: psycopg.Connection[Any]) -> int:
            with c.transaction():
                if not self._schema_ok:
                    self._check_schema_sync(c)
                return self._fan_out(c, events, params)

        return self._retrying(run)

    def _fan_out(
        self,
        c: SyncConn,
        events: list[Message],
        params: dict[str, Any],
        remember: bool = True,
    ) -> int:
        logged = {r[0] for r in c.execute(self.q.log_events, params).fetchall()}
        types = sorted({m.name for m in events if m.id in logged})
        bound = c.execute(self.q.bindings_of, (types,)).fetchall()
        rows = self._deliveries(events, logged, bound)
        if rows:
            self._insert(c, rows, remember, hand=remember)
        return len(rows)

    # -- the outbox's fast path: the caller's transaction on this database --------
    #
    # See joined.py: whether a caller's connection is to this database is read
    # on the server, once per connection; then the statements above run on it
    # (through a cursor of tuples, whatever the caller's row factory), inside
    # its transaction.  Queues made there are not remembered: it may roll back.

    def _my_identity(self) -> Identity | None:
        if self._identity is None:
            with self.borrow() as c:
                if not self._schema_ok:
                    self._check_schema_sync(c)
                self._identity = read_identity(c, self.schema)
        return self._identity

    async def _amy_identity(self) -> Identity | None:
        if self._identity is None:
            self._identity = await self._run(lambda c: aread_identity(c, self.schema))
        return self._identity

    def owns_connection_sync(self, sql: Sql) -> bool:
        conn = driver(sql)
        if conn is None:
            return False
        known = self._joined.get(conn)
        if known is None:
            mine = self._my_identity()
            theirs = read_identity(conn, self.schema)
            known = mine is not None and theirs is not None and mine.same(theirs)
            self._joined[conn] = known
        return known

    async def owns_connection(self, sql: Sql) -> bool:
        if not sql.is_async:
            return self.owns_connection_sync(sql)
        conn = await adriver(sql)
        if conn is None:
            return False
        known = self._joined.get(conn)
        if known is None:
            mine = await self._amy_identity()
            theirs = await aread_identity(conn, self.schema)
            known = mine is not None and theirs is not None and mine.same(theirs)
            self._joined[conn] = known
        return known

    def enqueue_with_sync(self, sql: Sql, msgs: Sequence[Message]) -> None:
        conn = driver(sql)
        if conn is None:
            raise ValueError("not a psycopg connection: ask owns_connection_sync first")
        check_in_transaction(conn)
        cur = conn.cursor(row_factory=tuple_row)
        tasks = [self._row(m) for m in msgs if m.kind == "task"]
        if tasks:
            self._insert(cur, tasks, remember=False)
        events, params = self._events(m for m in msgs if m.kind != "task")
        if events:
            self._fan_out(cur, events, params, remember=False)

    async def enqueue_with(self, sql: Sql, msgs: Sequence[Message]) -> None:
        if not sql.is_async:
            return self.enqueue_with_sync(sql, msgs)
        conn = await adriver(sql)
        if conn is None:
            raise ValueError("not a psycopg connection: ask owns_connection first")
        check_in_transaction(conn)
        cur = conn.cursor(row_factory=tuple_row)
        tasks = [self._row(m) for m in msgs if m.kind == "task"]
        if tasks:
            await self._ainsert(cur, tasks, remember=False)
        events, params = self._events(m for m in msgs if m.kind != "task")
        if events:
            await self._afan_out(cur, events, params, remember=False)

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
            "after": cursor if cursor and is_uuid(cursor) else NIL_UUID,
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
    # retried with backoff until the producer's deadline (``App(enqueue_timeout=)``),
    # or for the URL's ``reconnect`` seconds.

    def _row(self, m: Message) -> tuple[Any, ...]:
        """One job as stored: (id, queue, name, kind, priority, max_attempts,
        key, body, eta, msg_key), then its unique mode (the "unique" header of
        a keyed task, else None).  ``key`` is the unique key a task holds,
        ``msg_key`` the message's key of every job (event deliveries too), for
        search.  Encoded and size-checked before any I/O.

        A bulk enqueue keeps every row until its commit (to store the batch
        again if COPY fails): the body is a compact copy (``encode_checked``
        makes one for every broker; orjson's own buffers, kept by the
        thousand, cost ~6 µs a job on the benchmark host, half of a
        10,000-job ``enqueue_many``)."""
        key = m.key if m.kind == "task" else None
        body = encode_checked(m, self.max_message_size)
        return (
            m.id,
            m.queue,
            m.name,
            m.kind,
            m.priority,
            m.max_attempts,
            key,
            body,
            m.eta,
            m.key,
            None if key is None else m.headers.get("unique"),
        )

    def _params(self, rows: Sequence[tuple[Any, ...]]) -> dict[str, Any]:
        if len(rows) == 1:
            p = dict(zip(ROW_FIELDS, rows[0], strict=False))  # not the unique mode
        else:
            p = {f: [r[i] for r in rows] for i, f in enumerate(ROW_FIELDS)}
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
        return await self._aretrying(lambda c: self._ainsert(c, rows, hand=True))

    async def _aretrying(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """``_run(fn)`` again on a fresh connection, with backoff, while the
        server is away, until the producer's deadline (or ``reconnect``):
        for idempotent writes only.  A server that refuses the URL (role,
        password, database) fails at once."""
        backoff: Backoff | None = None
        while True:
            try:
                return await self._run(fn)
            except psycopg.OperationalError as exc:
                backoff = backoff or Backoff(self.opts.reconnect)
                pause = None if refusal(exc) else backoff.pause()
                if pause is None:
                    raise self.failure(exc, backoff.waited) from exc
            await asyncio.sleep(pause)

    async def aenqueue_in(
        self, conn: psycopg.AsyncConnection[Any], msgs: Iterable[Message]
    ) -> list[str]:
        """Enqueue on the caller's connection, inside its transaction if it has
        one (the transactional outbox): the jobs and their NOTIFY become
        visible when the caller commits, and vanish if it rolls back."""
        rows = [self._row(m) for m in msgs]
        return await self._ainsert(conn, rows) if rows else []

    def _freeing(self, rows: Sequence[tuple[Any, ...]]) -> tuple[list[str], list[str]] | None:
        """The keys (and unique modes) of unique jobs whose holder may no longer block."""
        unique = [r for r in rows if r[10] is not None]
        return ([r[6] for r in unique], [str(r[10]) for r in unique]) if unique else None

    def _statement(
        self, conn: SyncConn | AsyncConn, rows: Sequence[tuple[Any, ...]], hand: bool
    ) -> bytes:
        """The insert of ``rows``: one ready job that may go straight to an
        idle worker (``hand``: on our own connection, committed at once) is
        offered to one (queries.enqueue_hand) if its NOTIFY can carry it:
        the envelope, the queue's name and a header under the payload limit,
        in the server's encoding (UTF-8, or an ASCII envelope)."""
        if len(rows) != 1:
            return self.q.enqueue
        r = rows[0]
        if not hand or (r[8] is not None and r[8] > time.time()):
            return self.q.enqueue_one
        if self._no_waiter and self._no_waiter.get(r[1], 0.0) > time.monotonic():
            return self.q.enqueue_one
        body = r[7]
        if len(body) + 6 * len(r[1]) + HAND_HEADER >= NOTIFY_MAX:
            return self.q.enqueue_one
        if not body.isascii():
            on = conn.connection if isinstance(conn, psycopg.Cursor | psycopg.AsyncCursor) else conn
            if on.info.parameter_status("server_encoding") not in ("UTF8", "SQL_ASCII"):
                return self.q.enqueue_one
        return self.q.enqueue_hand

    def _offered(self, queue: str, row: Any) -> None:
        """After a handoff offer: if no waiter took it, the next ones of this
        queue for HAND_BACKOFF seconds are plain inserts."""
        if row and row[2]:
            self._no_waiter.pop(queue, None)
        else:
            self._no_waiter[queue] = time.monotonic() + HAND_BACKOFF

    async def _ainsert(
        self,
        conn: AsyncConn,
        rows: Sequence[tuple[Any, ...]],
        remember: bool = True,
        hand: bool = False,
    ) -> list[str]:
        new_queues = self._new_queues(rows)
        if new_queues:
            await conn.execute(self.q.add_queues, (new_queues,))
        if freeing := self._freeing(rows):
            await conn.execute(self.q.free_keys, freeing)
        stmt = self._statement(conn, rows, hand)
        row = await (await conn.execute(stmt, self._params(rows))).fetchone()
        if stmt is self.q.enqueue_hand:
            self._offered(rows[0][1], row)
        holders: dict[str, str] = {}
        if (int(row[0]) if row else 0) < len(rows) and (keys := self._holders(rows)):
            holders = dict(await (await conn.execute(self.q.holders, (keys,))).fetchall())
        if remember:  # not while the caller's transaction may still roll back
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
            await conn.execute(self.q.copy_memory)
            data = CopyRows(conn.info.encoding)
            async with conn.cursor().copy(self.q.copy) as cp:
                for r in itertools.chain(head, (self._row(m) for m in rest)):
                    kept.append(r)
                    if r[8] is not None and r[8] > now:
                        later.append(r)
                    elif (chunk := data.add(r)) is not None:
                        await cp.write(chunk)
                await cp.write(data.end())
            ids = [r[0] for r in kept]
            if later:
                held = await self._ainsert(conn, later)
                ids = merge_ids(kept, later, held)
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
        if len(head) == COPY_MIN:
            copied: list[tuple[Any, ...]] = []
            try:
                with self.borrow() as conn:
                    return self._copy(conn, head, it, copied)
            except (psycopg.errors.UniqueViolation, psycopg.OperationalError):
                rows = copied
        if not rows:
            return []
        return self._retrying(lambda c: self._insert(c, rows, hand=True))

    def _retrying(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``_aretrying`` for sync producers, on the sync pool."""
        backoff: Backoff | None = None
        while True:
            try:
                with self.borrow() as conn:
                    return fn(conn)
            except psycopg.OperationalError as exc:
                backoff = backoff or Backoff(self.opts.reconnect)
                pause = None if refusal(exc) else backoff.pause()
                if pause is None:
                    raise self.failure(exc, backoff.waited) from exc
            time.sleep(pause)

    def enqueue_in(self, conn: psycopg.Connection[Any], msgs: Iterable[Message]) -> list[str]:
        """``aenqueue_in`` for a sync psycopg connection."""
        rows = [self._row(m) for m in msgs]
        return self._insert(conn, rows) if rows else []

    def _insert(
        self,
        conn: SyncConn,
        rows: Sequence[tuple[Any, ...]],
        remember: bool = True,
        hand: bool = False,
    ) -> list[str]:
        if not self._schema_ok and isinstance(conn, psycopg.Connection):
            self._check_schema_sync(conn)
        new_queues = self._new_queues(rows)
        if new_queues:
            conn.execute(self.q.add_queues, (new_queues,))
        if freeing := self._freeing(rows):
            conn.execute(self.q.free_keys, freeing)
        stmt = self._statement(conn, rows, hand)
        row = conn.execute(stmt, self._params(rows)).fetchone()
        if stmt is self.q.enqueue_hand:
            self._offered(rows[0][1], row)
        holders: dict[str, str] = {}
        if (int(row[0]) if row else 0) < len(rows) and (keys := self._holders(rows)):
            holders = dict(conn.execute(self.q.holders, (keys,)).fetchall())
        if remember:
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
            conn.execute(self.q.copy_memory)
            cur = conn.cursor()
            data = CopyRows(conn.info.encoding)
            # the writer thread sends while this one encodes: the server stores
            # the first rows while the last ones are being made
            with cur.copy(self.q.copy, writer=QueuedLibpqWriter(cur)) as cp:
                for r in itertools.chain(head, (self._row(m) for m in rest)):
                    kept.append(r)
                    if r[8] is not None and r[8] > now:
                        later.append(r)
                    elif (chunk := data.add(r)) is not None:
                        cp.write(chunk)
                cp.write(data.end())
            ids = [r[0] for r in kept]
            if later:
                ids = merge_ids(kept, later, self._insert(conn, later))
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
        listener = st.listener
        # jobs handed to this loop after their fetch had stopped waiting
        kept = listener.take(queues, limit)
        if kept:
            return kept
        await _withdrawn(st)
        if wait <= 0:
            return (await self._claim_safely(st, queues, limit, lease, worker))[0]
        deadline = time.monotonic() + wait
        if not listener.listening:  # the first wait of this loop: LISTEN first
            await listener.ready(min(wait, 1.0))
        # The waiter exists before the claim, so a NOTIFY sent after the claim's
        # snapshot is never missed; an idle pass is one round trip.  The claim
        # registers this fetch for a handoff until its deadline if it found
        # nothing; a job handed to it comes with the NOTIFY, ready to run.
        waiter = listener.add(queues)
        # A busy worker (its last claim found jobs) claims plainly first: the
        # idle claim's extra steps (settle waits, register) cost ~4% of W4's
        # drain, and a busy worker's claim rarely comes back empty; when it
        # does, the idle claim follows at once.
        plain = st.busy
        try:
            while True:
                waiter.event.clear()
                remaining = deadline - time.monotonic()
                if plain:
                    out, due = await self._claim_safely(st, queues, limit, lease, worker)
                else:
                    out, due = await self._claim_safely(
                        st, queues, limit, lease, worker, waiter, remaining
                    )
                st.busy = bool(out)
                if waiter.handed:  # handed while the claim was on its way
                    out = self._merge(listener, waiter, out, limit)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0:
                    return out
                if plain:  # idle now: claim again, registering the wait
                    plain = False
                    continue
                if due is not None:
                    remaining = min(remaining, max(0.0, due))
                if not listener.listening:
                    remaining = min(remaining, self.opts.poll_interval)
                await waiter.wait(remaining)
                out = self._merge(listener, waiter, listener.take(queues, limit), limit)
                if out:
                    return out
        except asyncio.CancelledError:
            # stopped (the worker stops): withdraw this fetch's waits now,
            # and give back what was handed to them meanwhile
            listener.remove(waiter)
            task = st.loop.create_task(self._withdraw(st, queues, lease, worker, waiter))
            st.giving_back.add(task)
            task.add_done_callback(st.giving_back.discard)
            raise
        finally:
            listener.remove(waiter)

    @staticmethod
    def _merge(
        listener: Listener, waiter: Waiter, out: list[Delivery], limit: int
    ) -> list[Delivery]:
        """What the fetch of ``waiter`` returns: the jobs handed to it, then
        ``out``; any beyond ``limit`` wait in the inbox for the next fetch."""
        if waiter.handed:
            got, waiter.handed = waiter.handed, []
            seen = {d.id for d in got}
            out = got + [d for d in out if d.id not in seen]
        if len(out) > limit:
            listener.keep(out[limit:])
            out = out[:limit]
        return out

    async def _withdraw(
        self, st: _LoopState, queues: list[str], lease: float, worker: str, waiter: Waiter
    ) -> None:
        """Settle the waits of a fetch that was cancelled, and give back
        (uncharged) the jobs handed to them."""
        listener = st.listener
        if self._states.get(st.loop) is not st:  # closed meanwhile: _settle did it
            return
        try:
            out: list[Delivery] = []
            deadline = time.monotonic() + WITHDRAW_HOLD
            while True:
                waiter.event.clear()
                got, _ = await self._run(
                    lambda c: self._claim(c, queues, 0, lease, worker, None, listener, waiter),
                    retry=False,
                    work=True,
                )
                out += got
                # A wait a producer was handing a job to right then (busy: its
                # row locked) is settled by that job's NOTIFY, or adopted by the
                # next claim once the handoff committed: settle it here, so
                # that when the withdrawal ends (the next fetch waits for it)
                # such a job is ready again, not on its way to the inbox.
                remaining = deadline - time.monotonic()
                if not listener.carries(waiter) or remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), min(remaining, 0.05))
                if not listener.carries(waiter):
                    break
            out += listener.take(queues, len(listener.inbox))
            await self.requeue(out)
        except Exception as exc:  # their leases run out; the rescuer gives them back
            log.debug("could not withdraw an idle fetch's waits: %s", exc)

    async def _settle(self) -> None:
        """Before this loop's connections close: the waits this loop left are
        withdrawn and the jobs handed to them given back, uncharged."""
        try:
            st = self._states.get(asyncio.get_running_loop())
        except RuntimeError:
            return
        if st is None or self._pid != os.getpid():
            return
        await asyncio.gather(*st.giving_back, return_exceptions=True)
        listener = st.listener
        back = listener.drain()
        try:
            if listener.pending:
                queues = sorted({q for w in listener.pending.values() for q in w.queues})
                gone = Waiter(queues)
                gone.active = False  # carries every pending wait: all are of these queues
                out, _ = await self._run(
                    lambda c: self._claim(c, queues, 0, 1.0, "", None, listener, gone),
                    retry=False,
                    work=True,
                )
                back += out
            await self.requeue(back)
        except Exception as exc:
            log.debug("could not withdraw this loop's waits on close: %s", exc)

    async def _claim_safely(
        self,
        st: _LoopState,
        queues: list[str],
        limit: int,
        lease: float,
        worker: str,
        waiter: Waiter | None = None,
        wait: float = 0.0,
    ) -> tuple[list[Delivery], float | None]:
        """A claim that can be cancelled: if the caller gives up while the
        claim is in flight, what it claimed is given back (uncharged).

        Until its first statement is sent, the claim is *boarding*: acks made
        meanwhile on this loop wait to travel with it (see ``ack``)."""
        ticket = _Ticket(st)
        listener = st.listener if waiter is not None else None
        task = asyncio.ensure_future(
            self._run(
                lambda c: self._claim(
                    c, queues, limit, lease, worker, ticket, listener, waiter, wait
                ),
                retry=False,
                work=True,
            )
        )
        task.add_done_callback(lambda _: ticket.leave())
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:

            def give_back(t: asyncio.Future[tuple[list[Delivery], float | None]]) -> None:
                if t.cancelled() or t.exception() is not None or not t.result()[0]:
                    return
                self._give_back(st, t.result()[0])

            task.add_done_callback(give_back)
            raise

    async def _claim(
        self,
        conn: psycopg.AsyncConnection[Any],
        queues: list[str],
        limit: int,
        lease: float,
        worker: str,
        ticket: _Ticket | None = None,
        listener: Listener | None = None,
        waiter: Waiter | None = None,
        wait: float = 0.0,
    ) -> tuple[list[Delivery], float | None]:
        """Claim up to ``limit`` jobs; with none, also say in how many seconds
        the next scheduled job of ``queues`` is due (None: none is).  The
        first statement also acks the rides waiting on this loop, if any.

        With a ``waiter`` (an idle fetch's claim) it also settles the waits
        of this loop that ``waiter`` carries (adopting a job handed to one
        whose NOTIFY was lost) and, with nothing to return and ``wait`` > 0,
        registers a new wait of ``wait`` seconds (queries.waiting)."""
        token = secrets.randbits(62)
        params: dict[str, Any] = {"token": token, "lease": lease, "worker": worker, "limit": limit}
        claim, fused = self._claims(params, queues, listener is not None and waiter is not None)
        rides = ticket.take() if ticket is not None else []
        stmt = claim
        if rides:
            ds = [d for r in rides for d in r.ds]
            params["ack_id"] = ",".join([d.id for d in ds])
            params["ack_token"] = ",".join([str(d.token) for d in ds])
            params["retention"] = self.retention
            stmt = fused
        rows: list[tuple[Any, int]] = []  # (row, its token)
        due = None
        while True:
            carried: list[int] = []
            if listener is not None and waiter is not None:
                # a wait is registered only with nothing claimed yet (the
                # adoption of a handed job goes by its token)
                carried = _to_wait(params, listener, waiter, token, 0.0 if rows else wait)
            try:
                cur = await conn.execute(stmt, params, binary=True)
                got = await cur.fetchall()
            except BaseException as exc:
                for r in rides:  # not acked: their callers retry them
                    if not r.done.done():
                        r.done.set_exception(_unsettled(exc))
                raise
            finally:
                if listener is not None:
                    listener.registering.discard(token)
            for r in rides:
                if not r.done.done():
                    r.done.set_result(True)
            rides, stmt = [], claim
            if listener is not None:
                promoted, due = _waited(listener, got, token, carried, rows)
            else:
                promoted = got[0][8] if got else 0
                if got and got[0][0] is None:
                    due = got[0][9]
                else:
                    rows += [(r, token) for r in got]
            # due jobs were just promoted: the next statement can claim them
            if not promoted or len(rows) >= limit:
                break
            params["limit"] = limit - len(rows)
        if len(rows) > 1:  # RETURNING has no order: priority, then FIFO, per queue
            order = {q: i for i, q in enumerate(queues)}
            rows.sort(key=lambda x: (order.get(x[0][1], 0), -x[0][5], x[0][6], x[0][0]))
        return [delivery_row(r, t) for r, t in rows], (None if rows else due)

    def _claims(
        self, params: dict[str, Any], queues: list[str], waiting: bool
    ) -> tuple[bytes, bytes]:
        """The claim statement for ``queues`` and its variant that carries
        acks; ``waiting``: an idle fetch's (queries.waiting)."""
        q = self.q
        if len(queues) == 1:
            params["queue"] = queues[0]
            return (q.wait_one, q.ack_wait_one) if waiting else (q.claim_one, q.ack_claim_one)
        params["queues"] = queues
        return (q.wait_many, q.ack_wait_many) if waiting else (q.claim_many, q.ack_claim_many)

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
        elif await self._ride(ds):
            return
        await self._run(lambda c: c.execute(stmt, params), work=True)

    async def _ride(self, ds: Sequence[Delivery]) -> bool:
        """Ack ``ds`` with a claim of this loop, if one is about to be sent:
        True once acked that way, False if none came (the caller acks alone).

        A worker's finished job wakes its settler (the ack) and its fetch loop
        (the next claim) together; the claim boards a few turns of the loop
        later (the fetch's task, then the claim's).  So the ack waits at most
        ``RIDE_TURNS`` turns for a claim to board, then travels alone (in a W4
        run, 6 turns let ~80% of the acks ride, 3 turns ~40%).  Either way it
        is one transaction: the job is acked, or not at all and retried."""
        st = self._state()
        ride = Ride(ds, st.loop.create_future())
        st.riders.append(ride)
        try:
            for _ in range(RIDE_TURNS):
                if st.boarding or ride.done.done():
                    break
                await asyncio.sleep(0)
            if not st.boarding and not ride.done.done():
                st.riders.remove(ride)
                return False
            return await ride.done
        finally:
            if ride in st.riders:  # cancelled while waiting
                st.riders.remove(ride)

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        params = self._batch(ds)
        params["at"] = [d.retry_at for d in ds]
        params["err"] = [err_json(d) for d in ds]
        params["etype"] = [None if d.error is None else d.error.type for d in ds]
        await self._run(lambda c: c.execute(self.q.retry, params), work=True)

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if not ds:
            return
        params = self._batch(ds)
        params["err"] = [err_json(d) for d in ds]
        params["etype"] = [None if d.error is None else d.error.type for d in ds]
        await self._run(lambda c: c.execute(self.q.dead, params), work=True)

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if ds:
            params = self._batch(ds)
            params["at"] = [d.retry_at for d in ds]
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

    async def rescue(self) -> Rescued:
        async def run(c: psycopg.AsyncConnection[Any]) -> Rescued:
            cur = await c.execute(self.q.rescue, {"type": LEASE_EXPIRED, "channel": self.q.channel})
            row = await cur.fetchone()
            if not row:
                return Rescued()
            dead = [
                DeadLetter(
                    str(id_),
                    str(queue),
                    str(name),
                    ErrorRecord.from_dict(err or {}),
                    stored_message(bytes.fromhex(body), str(queue), int(attempt), errors),
                )
                for id_, queue, name, err, attempt, body, errors in row[2] or ()
            ]
            return Rescued(int(row[0]), dead)

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
            await c.execute(self.q.fold_counts)
            await c.execute(self.q.prune_counts)
            await c.execute(self.q.prune_rate)
            await c.execute(self.q.prune_slots)
            await c.execute(self.q.prune_waiters, (WAITER_GRACE,))
            cur = await c.execute(self.q.prune_events, (self.event_retention, PRUNE_BATCH))
            return behind or cur.rowcount == PRUNE_BATCH

        self._prune_behind = await self._run(prune, work=True)
        return True


class _Ticket:
    """One claim's place among the claims boarding on a loop (``st.boarding``)."""

    __slots__ = ("aboard", "st")

    def __init__(self, st: _LoopState) -> None:
        self.st = st
        self.aboard = True
        st.boarding += 1

    def take(self) -> list[Ride]:
        """The rides waiting now; the claim has left the boarding."""
        rides, self.st.riders = self.st.riders, []
        self.leave()
        return rides

    def leave(self) -> None:
        """Done boarding (sent, failed or cancelled).  The last claim to leave
        sends the rides it did not take off alone."""
        if not self.aboard:
            return
        self.aboard = False
        st = self.st
        st.boarding -= 1
        if not st.boarding:
            rides, st.riders = st.riders, []
            for r in rides:
                if not r.done.done():
                    r.done.set_result(False)


async def _withdrawn(st: _LoopState) -> None:
    """Wait for the withdrawals of this loop's cancelled fetches: a job being
    handed to one of their waits is running for nobody until it reaches the
    inbox or the withdrawal gives it back, so a claim before that would not
    see it (a fetch right after a cancelled one would miss a job just
    enqueued)."""
    if st.giving_back:
        await asyncio.gather(*list(st.giving_back), return_exceptions=True)


def _to_wait(
    params: dict[str, Any], listener: Listener, waiter: Waiter, token: int, wait: float
) -> list[int]:
    """The parameters of an idle fetch's claim: the waits it settles (returned)
    and its own, registered for ``wait`` seconds while handoffs can reach us."""
    carried = listener.carried(waiter)
    params["mine"] = ",".join(map(str, carried))
    params["channel"] = listener.hand_channel
    params["wait"] = wait if listener.listening else 0.0
    if params["wait"] > 0:
        listener.pending[token] = waiter
        listener.registering.add(token)
    return carried


def _waited(
    listener: Listener,
    got: list[Any],
    token: int,
    carried: list[int],
    rows: list[tuple[Any, int]],
) -> tuple[int, float | None]:
    """Read an idle fetch's claim (queries.waiting): its claimed and adopted
    jobs go to ``rows``; the waits it settled leave ``listener.pending``, as
    does its own if it did not register.  Returns (promoted, due)."""
    promoted, due, registered, busy = 0, None, 0, None
    for r in got:
        if r[0] is None:  # the one row of the statement's findings
            promoted, due, registered, busy = r[9], r[10], r[11], r[12]
        elif r[8] is None:
            rows.append((r, token))
        elif listener.pending.pop(r[8], None) is not None:
            rows.append((r, r[8]))  # adopted: handed to us, its NOTIFY lost
        # else: its NOTIFY came first, and the job went to a fetch that way
    in_flight = {int(t) for t in busy.split(",")} if busy else set()
    for t in carried:  # settled: handed nothing, or adopted
        if t not in in_flight:
            listener.pending.pop(t, None)
    if not registered:
        listener.pending.pop(token, None)
    return promoted, due


def _unsettled(exc: BaseException) -> BaseException:
    """What a rider's ack raises when its claim failed."""
    if isinstance(exc, Exception):
        return exc
    return psycopg.OperationalError(f"the claim carrying this ack did not complete: {exc!r}")


__all__ = ["COPY_MIN", "MAINTENANCE_LOCK", "PostgresBroker"]
