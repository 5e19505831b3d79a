"""The PostgreSQL broker's producer side: enqueue, publish, the outbox's fast path.

* **Enqueue** has three shapes of one insert, chosen by batch size: one row
  (scalar parameters), a few rows (arrays spread by ``unnest``), and bulk
  (``COPY``, with no per-row work on the server beyond storing it).  Each
  batch is one transaction; its ``NOTIFY`` goes out at commit.
* **Handoff**: a single enqueue of a ready job is stored already running for
  an idle fetch waiting on its queue (``dw_waiters``) and sent in the
  NOTIFY, so an idle worker starts it without a claim's round trip
  (listen.py, transport.py).
* **Events**: one statement per publish logs the new events (a stored id
  is skipped) and inserts one job per bound queue, made here from the
  bindings as last read and stored only if the database still holds those.
* **The outbox's fast path** (joined.py): on a caller's connection to this
  very database, the same statements run inside the caller's transaction.

Enqueue is idempotent (a stored id or a held key is not stored again), so a
producer whose connection dies mid-call retries with backoff and can never
store a job twice.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.copy import QueuedLibpqWriter
from psycopg.rows import tuple_row

from ...message import Message, encode_checked, uuid7
from ..deadline import Backoff
from ..sql.rows import events_page, is_uuid
from ..types import Binding, delivery_of
from .connection import PostgresConnection, refusal
from .joined import Identity, adriver, aread_identity, check_in_transaction, driver, read_identity
from .pool import akept, kept
from .rows import NIL_UUID, ROW_FIELDS, CopyRows, merge_ids

if TYPE_CHECKING:
    from ...sqldb import Sql

#: batches of at least this many jobs are written with COPY
COPY_MIN = 64
#: PostgreSQL's NOTIFY payload limit (bytes, exclusive): a handed job travels in one
NOTIFY_MAX = 8000
#: room in a handoff's payload for its header (token, id, lease end; the
#: queue's name is counted apart)
HAND_HEADER = 128
#: seconds a queue's single enqueues skip the handoff after an offer found no
#: free waiter (a backlog, a busy or no worker): the lookup of a free waiter
#: costs server time on every enqueue; an idle worker missed meanwhile claims
#: as before
HAND_BACKOFF = 0.05

T = TypeVar("T")
#: a connection (or a cursor on one) that the insert statements run on
SyncConn = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncConn = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]
#: the statements of one insert or publish, written once for sync and async
#: connections: it yields each statement and its parameters and is sent
#: back the statement's rows (none for a statement that returns none)
Plan = Generator[tuple[bytes, Any], list[Any], T]


class PostgresEnqueue(PostgresConnection):
    """Enqueue, events and the outbox's fast path."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        #: this broker's database, as the outbox's fast path compares it
        self._identity: Identity | None = None
        #: callers' psycopg connections: whether each is to this database
        self._joined: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        #: the bindings of each event type published, as last read from the
        #: database (a hint: every publish checks them there, see _fan_out_plan)
        self._bound: dict[str, list[tuple[str, str, int]]] = {}

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
        thousand, are costly to hold: docs/benchmarks-postgres.md)."""
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
            None if m.eta is None else self.clock.to_server(m.eta),
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
        await self._read_clock()
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
        return await self._aretrying(lambda c: self._ainsert(akept(c), rows, hand=True))

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
        # not offered: a job without an eta takes the lean statement
        one = self.q.enqueue_ready if r[8] is None else self.q.enqueue_one
        if not hand or (r[8] is not None and r[8] > self.clock.now()):
            return one
        if self._no_waiter and self._no_waiter.get(r[1], 0.0) > time.monotonic():
            return one
        body = r[7]
        if len(body) + 6 * len(r[1]) + HAND_HEADER >= NOTIFY_MAX:
            return one
        if not body.isascii():
            on = conn.connection if isinstance(conn, psycopg.Cursor | psycopg.AsyncCursor) else conn
            if on.info.parameter_status("server_encoding") not in ("UTF8", "SQL_ASCII"):
                return one
        return self.q.enqueue_hand

    def _offered(self, queue: str, row: Any) -> None:
        """After a handoff offer: if no waiter took it, the next ones of this
        queue for HAND_BACKOFF seconds are plain inserts."""
        if row and row[2]:
            self._no_waiter.pop(queue, None)
        else:
            self._no_waiter[queue] = time.monotonic() + HAND_BACKOFF

    def _insert_plan(
        self,
        conn: SyncConn | AsyncConn,
        rows: Sequence[tuple[Any, ...]],
        remember: bool = True,
        hand: bool = False,
    ) -> Plan[list[str]]:
        """The statements that store ``rows`` (and the queues they name), for
        ``run_plan`` or ``arun_plan``; returns each row's id, or the id of the
        stored job that holds its key."""
        new_queues = self._new_queues(rows)
        if new_queues:
            yield self.q.add_queues, (new_queues,)
        if freeing := self._freeing(rows):
            yield self.q.free_keys, freeing
        stmt = self._statement(conn, rows, hand)
        if stmt is self.q.enqueue_ready:
            r = rows[0]
            got = yield stmt, (r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[9], r[7], self.q.channel)
        else:
            got = yield stmt, self._params(rows)
        row = got[0] if got else None
        if stmt is self.q.enqueue_hand:
            self._offered(rows[0][1], row)
        holders: dict[str, str] = {}
        if (int(row[0]) if row else 0) < len(rows) and (keys := self._holders(rows)):
            holders = dict((yield self.q.holders, (keys,)))
        if remember:  # not while the caller's transaction may still roll back
            self._known_queues.update(new_queues)
        return self._ids(rows, holders)

    async def _ainsert(
        self,
        conn: AsyncConn,
        rows: Sequence[tuple[Any, ...]],
        remember: bool = True,
        hand: bool = False,
    ) -> list[str]:
        return await arun_plan(conn, self._insert_plan(conn, rows, remember, hand))

    async def _acopy(
        self,
        conn: psycopg.AsyncConnection[Any],
        head: list[tuple[Any, ...]],
        rest: Iterator[Message],
        kept: list[tuple[Any, ...]],
    ) -> list[str]:
        now = self.clock.now()
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
        self._read_clock_blocking()
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
        return self._retrying(lambda c: self._insert(self._own(c), rows, hand=True))

    def _own(self, conn: psycopg.Connection[Any]) -> SyncConn:
        """A pooled connection's kept cursor (pool.py), the schema checked."""
        if not self._schema_ok:
            self._check_schema_sync(conn)
        return kept(conn)

    def _retrying(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``_aretrying`` for sync producers, on the sync pool."""
        backoff: Backoff | None = None
        while True:
            try:
                return self.with_sync(fn)
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
        return run_plan(conn, self._insert_plan(conn, rows, remember, hand))

    def _copy(
        self,
        conn: psycopg.Connection[Any],
        head: list[tuple[Any, ...]],
        rest: Iterator[Message],
        kept: list[tuple[Any, ...]],
    ) -> list[str]:
        if not self._schema_ok:
            self._check_schema_sync(conn)
        now = self.clock.now()
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

    # -- events ------------------------------------------------------------------
    #
    # One statement per publish (queries.publish): the new events go to the
    # log (a stored id is skipped, so a relay that publishes twice delivers
    # once) and one job per bound queue is stored with them (its NOTIFY goes
    # out at commit).  The jobs are made here from the bindings this broker
    # remembers (``_bound``, read from the database on first use of a type);
    # the statement stores them only if the database holds exactly those
    # bindings, else nothing, and they are read again and the statement sent
    # again.  Five round trips (BEGIN, the log, the bindings, the jobs,
    # COMMIT) became one.

    def _events(self, msgs: Iterable[Message]) -> tuple[list[Message], dict[str, Any]]:
        events = list(msgs)
        limit = self.max_message_size
        params = {
            "ev_id": [m.id for m in events],
            "ev_type": [m.name for m in events],
            "ev_body": [encode_checked(m, limit) for m in events],
        }
        return events, params

    def _learn(self, types: Sequence[str], bound: Iterable[Any]) -> None:
        """Remember the bindings read for ``types`` (a type with none too)."""
        got: dict[str, list[tuple[str, str, int]]] = {t: [] for t in types}
        for pattern, queue, attempts in bound:
            got.setdefault(pattern, []).append((pattern, queue, int(attempts)))
        self._bound.update(got)

    def _deliveries(
        self, events: list[Message], bound: list[tuple[str, str, int]]
    ) -> tuple[list[tuple[Any, ...]], list[str]]:
        """One job per event and bound queue, and the event of each."""
        by_type: dict[str, list[Binding]] = {}
        for pattern, queue, attempts in bound:
            by_type.setdefault(pattern, []).append(Binding(pattern, queue, attempts))
        rows, of_event = [], []
        for m in events:
            for b in by_type.get(m.name, ()):
                rows.append(self._row(delivery_of(m, b, uuid7())))
                of_event.append(m.id)
        return rows, of_event

    async def publish(self, msgs: Iterable[Message]) -> int:
        events, params = self._events(msgs)
        if not events:
            return 0
        # an event already in the log is not delivered again: safe to repeat
        return await self._aretrying(
            lambda c: arun_plan(akept(c), self._fan_out_plan(c, events, params))
        )

    def _fan_out_plan(
        self,
        c: SyncConn | AsyncConn,
        events: list[Message],
        params: dict[str, Any],
        remember: bool = True,
    ) -> Plan[int]:
        """Log the new events and store one job per bound queue, in one
        statement (in ``c``'s transaction if it has one); returns how many
        jobs that made."""
        types = sorted({m.name for m in events})
        if missing := [t for t in types if t not in self._bound]:
            self._learn(missing, (yield self.q.bindings_of, (missing,)))
        while True:
            bound = [b for t in types for b in self._bound.get(t, ())]
            rows, of_event = self._deliveries(events, bound)
            new_queues = self._new_queues(rows)
            if new_queues:
                yield self.q.add_queues, (new_queues,)
            hand = len(rows) == 1 and self._statement(c, rows, remember) is self.q.enqueue_hand
            stmt, p = self._publish_statement(params, types, bound, rows, of_event, hand)
            [got] = yield stmt, p
            if got[3]:
                if hand:
                    self._offered(rows[0][1], got)
                if remember:  # not while the caller's transaction may still roll back
                    self._known_queues.update(new_queues)
                return int(got[0])
            # the bindings changed since they were read: read them again
            self._learn(types, (yield self.q.bindings_of, (types,)))

    def _publish_statement(
        self,
        params: dict[str, Any],
        types: list[str],
        bound: list[tuple[str, str, int]],
        rows: list[tuple[Any, ...]],
        of_event: list[str],
        hand: bool,
    ) -> tuple[bytes, dict[str, Any]]:
        """The publish statement and its parameters: one event of a type
        bound to one queue in scalars (``publish_one``, or ``publish_hand_one``
        when its job may go to an idle worker), else in arrays."""
        q = self.q
        if len(params["ev_id"]) == 1 and len(bound) == 1:
            p = dict(zip(ROW_FIELDS, rows[0], strict=False))
            p.update({k: v[0] for k, v in params.items()}, channel=q.channel)
            p.update(b_pattern=bound[0][0], b_queue=bound[0][1], b_attempts=bound[0][2])
            return (q.publish_hand_one if hand else q.publish_one), p
        p = {**params, "types": types, "channel": q.channel}
        p["b_pattern"] = [b[0] for b in bound]
        p["b_queue"] = [b[1] for b in bound]
        p["b_attempts"] = [b[2] for b in bound]
        if hand:
            p.update(zip(ROW_FIELDS, rows[0], strict=False))
            return q.publish_hand, p
        p.update({f: [r[i] for r in rows] for i, f in enumerate(ROW_FIELDS)})
        p["event"] = of_event
        return q.publish, p

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        events, params = self._events(msgs)
        if not events:
            return 0

        def run(c: psycopg.Connection[Any]) -> int:
            if not self._schema_ok:
                self._check_schema_sync(c)
            return run_plan(kept(c), self._fan_out_plan(c, events, params))

        return self._retrying(run)

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
            run_plan(cur, self._fan_out_plan(cur, events, params, remember=False))

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
            await arun_plan(cur, self._fan_out_plan(cur, events, params, remember=False))

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
        return events_page(rows, limit)


def run_plan(conn: SyncConn, plan: Plan[T]) -> T:
    """Run ``plan``'s statements on a sync connection (or cursor)."""
    try:
        stmt, params = next(plan)
        while True:
            cur = conn.execute(stmt, params)
            stmt, params = plan.send(cur.fetchall() if _has_rows(cur) else [])
    except StopIteration as done:
        out: T = done.value
        return out


async def arun_plan(conn: AsyncConn, plan: Plan[T]) -> T:
    """Run ``plan``'s statements on an async connection (or cursor)."""
    try:
        stmt, params = next(plan)
        while True:
            cur = await conn.execute(stmt, params)
            rows = await cur.fetchall() if _has_rows(cur) else []
            stmt, params = plan.send(rows)
    except StopIteration as done:
        out: T = done.value
        return out


def _has_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows (an INSERT without RETURNING does
    not): read from the result's status, not from ``description``, which
    builds a column object per column on every call of a one-at-a-time
    producer."""
    res = cur.pgresult
    return res is not None and res.status == pq.ExecStatus.TUPLES_OK
