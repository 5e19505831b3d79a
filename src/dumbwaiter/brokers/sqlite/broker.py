"""``sqlite:///PATH``: the embedded default broker.

One database file in WAL mode serves any number of producer and worker
processes on one machine.  SQLite lets one writer commit at a time, so every
state change is a short ``BEGIN IMMEDIATE`` transaction: a claim is one
``UPDATE ... RETURNING`` over the ready index, and no job is handed to two
workers while its lease holds (each lease carries a fencing token that every
later change of that job must present).

Durability: producer connections commit with ``synchronous=FULL`` (the WAL is
fsynced, so an enqueued job survives power loss); worker connections use
``NORMAL``.  Losing a worker's last commits to a power cut can only make a
job run again (its claim or ack is rolled back), never lose it.

Calls from async code run on one thread owned by the broker (sqlite3 blocks);
sync producers use a connection of their own thread, with no hop.  Short
key-value calls (up to ``QUICK_KEYS`` keys: a companion broker's job record, a limit) run
on the caller's thread when the write lock is free (``_quick``): they do not
wait for the disk (``synchronous=NORMAL``, no checkpoint), and a hop to the
broker's thread would cost more than the call, mostly in the GIL handed back
and forth with that thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import resources
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import orjson

from ...errors import BrokerError, ConfigurationError, InvalidURL, LeaseExpired
from ...flow import window_wait
from ...message import ErrorRecord, Message, decode, encode_checked, uuid7
from ...redact import mask_url
from ...sqldb import Sql
from .. import deadline, failure, urlopts
from ..base import (
    Binding,
    Broker,
    Capabilities,
    DeadLetter,
    Delivery,
    JobFilter,
    JobInfo,
    KvWrite,
    Page,
    QueueStats,
    Rescued,
    delivery_of,
    kv_write,
    stats_rows,
)
from ..sql.filters import SQLITE, where
from ..sql.rows import delivery_row, err_json, info_row, stored_message
from .wake import FileWaker

T = TypeVar("T")
log = logging.getLogger("dumbwaiter.sqlite")

#: finished jobs (without a kept result) are pruned after this many seconds
DEFAULT_RETENTION = 3600.0
#: 2: dw_jobs.msg_key (every job's Message.key, indexed for key search)
SCHEMA_VERSION = 2
_LEASE_EXPIRED = f"dumbwaiter.errors.{LeaseExpired.__name__}"
#: rows per INSERT statement (12 parameters each, under SQLite's 32,766 limit)
_INSERT_CHUNK = 2000
#: header "unique" -> the states in which a key's holder no longer blocks a new job
_UNIQUE_RELEASE = {
    "active": "('succeeded', 'dead', 'cancelled')",
    "queued": "('running', 'succeeded', 'dead', 'cancelled')",
}
_SYNC = {"off": "OFF", "normal": "NORMAL", "full": "FULL", "extra": "EXTRA"}
#: key-value calls of at most this many keys may run on the caller's thread
#: (``SQLiteBroker._quick``): one job's call (an enqueue's record, a lone
#: admission) is cheaper there than a hop, but a batch's is better left to
#: the broker's thread, where sqlite3 steps without the GIL while the event
#: loop goes on (a RabbitMQ worker's drain: 7,400-7,700 jobs/s at 4 against
#: 6,100-7,100 at 64, alternated runs of the harness' W1)
QUICK_KEYS = 4
#: commits on callers' threads between two WAL checkpoints, which run on the
#: broker's thread (a checkpoint fsyncs: it must not stall an event loop)
QUICK_CHECKPOINT = 1000
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
#: primary result codes that say the file cannot serve as this database,
#: whatever the wait: not a database, corrupt, not openable, not writable
_UNUSABLE = (
    sqlite3.SQLITE_NOTADB,
    sqlite3.SQLITE_CORRUPT,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_AUTH,
)
#: and those that may pass: a lock held too long, a full disk, an I/O error
_PASSING = (*_BUSY, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


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


#: columns of dw_jobs that older schemas lack, with their type (added in order)
_ADDED_COLUMNS = (("msg_key", "TEXT"),)  # version 2


def _apply_schema(conn: sqlite3.Connection) -> None:
    """Create what is missing and upgrade an older database, in the caller's
    transaction.  schema.sql is idempotent except for new columns of an
    existing dw_jobs (SQLite has no ADD COLUMN IF NOT EXISTS): those are
    added here first, so the file's indexes and backfills can name them."""
    have = {r[0] for r in conn.execute("SELECT name FROM pragma_table_info('dw_jobs')")}
    if have:  # an existing table (none yet: schema.sql creates it whole)
        for name, decl in _ADDED_COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE dw_jobs ADD COLUMN {name} {decl}")
    for stmt in _schema_statements():
        conn.execute(stmt)


SYNCHRONOUS = urlopts.choice(
    "synchronous",
    "full",
    list(_SYNC),
    "producer commits: full fsyncs each enqueue; normal does not",
)
RETENTION = urlopts.seconds("retention", DEFAULT_RETENTION, "seconds finished jobs stay visible")
BUSY_TIMEOUT = urlopts.seconds(
    "busy_timeout", 30.0, "seconds a connection waits for the write lock"
)
OPTIONS = urlopts.Table("sqlite", [SYNCHRONOUS, RETENTION, BUSY_TIMEOUT], check_hosts=False)


def parse_url(url: str) -> tuple[str, urlopts.Values]:
    """``sqlite:///rel.db`` is relative, ``sqlite:////abs.db`` absolute."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise InvalidURL(f"not a sqlite URL: {mask_url(url)!r}")
    if parts.netloc:
        raise InvalidURL(
            f"sqlite URL {mask_url(url)!r} has a host part ({mask_url(parts.netloc)!r}); "
            "write sqlite:///relative.db or sqlite:////absolute/path.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise InvalidURL(
            f"sqlite URL {mask_url(url)!r} names no database file (an in-memory database cannot be "
            "shared by workers; use memory:// for tests)"
        )
    return path, OPTIONS.parse(url)


class SQLiteBroker(Broker):
    capabilities: ClassVar[Capabilities] = Capabilities(
        sync_enqueue=True, transactional_outbox=True, multi_process=True, events=True, limits=True
    )
    schemes: ClassVar[tuple[str, ...]] = ("sqlite",)
    client_errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.path, opts = parse_url(url)
        self.retention = opts[RETENTION]
        self.busy_timeout = opts[BUSY_TIMEOUT]
        self.producer_sync = _SYNC[opts[SYNCHRONOUS]]
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._aconn: sqlite3.Connection | None = None
        self._wakers: dict[asyncio.AbstractEventLoop, FileWaker] = {}
        self._known_queues: set[str] = set()
        self._ready = False
        self._quick_writes = 0
        #: id(connection) -> the busy timeout it has now, in ms (producers
        #: lower it to their deadline: ``_producer_tx``)
        self._busy_ms: dict[int, int] = {}

    def failure(self, exc: BaseException, waited: float | None = None) -> BrokerError:
        """sqlite3's ``exc`` as the ``BrokerError`` it means: a file that cannot
        be this database (not a database, corrupt, not openable or writable:
        for good), a lock held too long or a full disk (for now), or else."""
        code = getattr(exc, "sqlite_errorcode", None)
        primary = -1 if code is None else code & 0xFF
        if primary in _UNUSABLE or (code is None and "not a database" in str(exc)):
            return failure.refused(self.url, exc)
        if primary in _PASSING:
            return failure.unavailable(self.url, exc, waited)
        return failure.failed(self.url, exc)

    # -- connections -------------------------------------------------------

    def _connect(self, synchronous: str, wait: float | None = None) -> sqlite3.Connection:
        """A new connection, the file in WAL mode and the schema in place;
        ``wait``: the most its set-up may wait for the write lock (a
        producer's deadline), instead of ``busy_timeout``."""
        d = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(d):
            raise ConfigurationError(f"directory {d!r} of sqlite database does not exist")
        timeout = self.busy_timeout if wait is None else wait
        conn = sqlite3.connect(
            self.path,
            timeout=timeout,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=256,
        )
        self._busy_ms[id(conn)] = round(timeout * 1000)
        try:
            self._wal(conn, timeout)
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute("PRAGMA temp_store=MEMORY")
            conn.execute("PRAGMA cache_size=-32000")
            if not self._ready:
                self._ensure_schema(conn)
            self._set_busy(conn, round(self.busy_timeout * 1000))
        except BaseException:
            self._busy_ms.pop(id(conn), None)
            conn.close()
            raise
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    def _wal(self, conn: sqlite3.Connection, wait: float) -> None:
        """Put the database in WAL mode.  SQLite answers a journal-mode switch
        that meets another connection's lock with SQLITE_BUSY at once, without
        its busy handler (several processes opening a new file together: a
        worker and its schedulers), so the switch is retried here for as long
        as ``wait`` (the busy timeout, or a producer's deadline) allows; a file
        already in WAL needs no switch."""
        until = time.monotonic() + wait
        pause = 0.001
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= until:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        """Create what is missing (every statement is IF NOT EXISTS), once per
        broker; refuse a database written by a newer schema."""
        row = None
        try:
            row = conn.execute("SELECT v FROM dw_meta WHERE k='schema_version'").fetchone()
        except sqlite3.OperationalError:
            pass
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise ConfigurationError(
                f"{self.path} has dumbwaiter schema {row[0]}, newer than this version "
                f"({SCHEMA_VERSION}) understands; upgrade dumbwaiter"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            _apply_schema(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._ready = True

    def _sync_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(self.producer_sync, deadline.remaining(self.busy_timeout))
            self._local.conn = conn
        return conn

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            await self.open()
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _worker_conn(self, wait: float | None = None) -> sqlite3.Connection:
        if self._aconn is None:
            self._aconn = self._connect("NORMAL", wait)
        return self._aconn

    def _quick_conn(self) -> sqlite3.Connection | None:
        """This thread's connection for ``_quick`` calls (None before ``open``).

        It never waits for a lock (``busy_timeout=0``: a busy database sends
        the call to the broker's thread instead) and never checkpoints the
        WAL itself (``_quick_wrote`` has the broker's thread do it)."""
        if self._executor is None or not self._ready:
            return None
        conn: sqlite3.Connection | None = getattr(self._local, "quick", None)
        if conn is None:
            conn = self._connect("NORMAL")
            self._set_busy(conn, 0)
            conn.execute("PRAGMA wal_autocheckpoint=0")
            self._local.quick = conn
        return conn

    async def _quick(
        self, fn: Callable[[sqlite3.Connection], T], size: int = 1, write: bool = True
    ) -> T:
        """Run ``fn`` (a transaction's body when ``write``, else a read) on
        the caller's thread if it is small and the write lock is free, else
        on the broker's thread.

        Only the ``BEGIN IMMEDIATE`` may meet a busy database: once it holds
        the lock, ``fn`` runs once, so a ``decide`` with effects is never run
        twice.  Calls do not keep their order against calls already sent to
        the broker's thread, which no caller may rely on: concurrent calls
        never had an order."""
        conn = self._quick_conn() if size <= QUICK_KEYS else None
        if conn is not None:
            try:
                if not write:
                    return fn(conn)
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in _BUSY:
                    raise
            else:
                out = self._body(conn, fn)
                self._quick_wrote()
                return out
        if write:
            return await self._run(self._wtx, fn)
        return await self._run(lambda: fn(self._worker_conn()))

    def _quick_wrote(self) -> None:
        self._quick_writes += 1
        if self._quick_writes % QUICK_CHECKPOINT == 0 and self._executor is not None:
            self._executor.submit(self._checkpoint).add_done_callback(_log_failure)

    def _checkpoint(self) -> None:
        """Copy the WAL back into the database without waiting for readers
        (PASSIVE), on the broker's thread: the quick connections never do."""
        self._worker_conn().execute("PRAGMA wal_checkpoint(PASSIVE)").close()

    def _body(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The rest of a transaction ``BEGIN IMMEDIATE`` opened: ``fn`` and
        the commit, or the rollback."""
        try:
            out = fn(conn)
            if isinstance(out, sqlite3.Cursor):
                out.close()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return out

    def _tx(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """One write transaction.

        A cursor that ``fn`` returns (``lambda c: c.executemany(...)``) is
        closed here, on the connection's thread: left open, it would be
        dropped on the event loop's thread, and CPython's sqlite3 resets the
        cursor's cached statement when it is collected, racing the next
        transaction that runs the same statement on the broker's thread.
        That race is the SQLITE_MISUSE (InterfaceError) seen under load; should
        CPython report one anyway, the transaction was rolled back whole, so it
        is run once more."""
        for attempt in (1, 2):
            conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(conn)
                if isinstance(out, sqlite3.Cursor):
                    out.close()
            except sqlite3.InterfaceError:
                conn.execute("ROLLBACK")
                if attempt == 2:
                    raise
                log.warning("sqlite reported API misuse; running the transaction again")
                continue
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return out
        raise AssertionError("unreachable")

    def _set_busy(self, conn: sqlite3.Connection, ms: int) -> None:
        """How long ``conn`` waits for the write lock (a PRAGMA only when
        that changes)."""
        if self._busy_ms.get(id(conn)) != ms:
            conn.execute(f"PRAGMA busy_timeout={ms}")
            self._busy_ms[id(conn)] = ms

    def _producer_tx(
        self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], wait: float
    ) -> T:
        """A producer's write transaction: it waits for the write lock no
        longer than ``wait`` (its deadline's rest, at most ``busy_timeout``),
        then raises ``BrokerUnavailable`` having stored nothing (the lock is
        taken by ``BEGIN IMMEDIATE``, before any write)."""
        self._set_busy(conn, round(wait * 1000))
        try:
            return self._tx(conn, fn)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF in _BUSY:
                raise self.failure(exc, wait) from exc
            raise

    def _wtx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A write transaction on the broker thread's connection."""
        return self._tx(self._worker_conn(), fn)

    # -- transport -------------------------------------------------------

    async def open(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="dumbwaiter-sqlite")
        if self._aconn is None:  # not yet, or an earlier open failed (a locked file)
            # read here: the broker's thread knows no producer call's deadline
            wait = deadline.remaining(self.busy_timeout)
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self._worker_conn, wait
            )

    async def close(self) -> None:
        for waker in self._wakers.values():
            waker.close()
        self._wakers.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._aconn = None
        with self._conns_lock:
            conns, self._conns = self._conns, []
        self._busy_ms.clear()
        for conn in conns:
            try:
                conn.close()
            except sqlite3.ProgrammingError:
                pass
        self._local = threading.local()

    async def enqueue(self, msgs: Iterable[Message]) -> list[str]:
        # the deadline is read here: the broker's thread has no producer call
        wait = deadline.remaining(self.busy_timeout)
        return await self._run(self._enqueue_worker_conn, msgs, wait)

    def _enqueue_worker_conn(self, msgs: Iterable[Message], wait: float) -> list[str]:
        # Enqueues from async producers share the broker thread's connection;
        # they must be as durable as sync ones, so FULL for this transaction,
        # and the worker's own calls get the full busy timeout back after it.
        rows = self._rows(msgs)
        conn = self._worker_conn(wait)
        conn.execute(f"PRAGMA synchronous={self.producer_sync}")
        try:
            return self._producer_tx(conn, lambda c: self._insert(c, rows), wait)
        finally:
            conn.execute("PRAGMA synchronous=NORMAL")
            self._set_busy(conn, round(self.busy_timeout * 1000))

    def enqueue_sync(self, msgs: Iterable[Message]) -> list[str]:
        rows = self._rows(msgs)
        wait = deadline.remaining(self.busy_timeout)
        return self._producer_tx(self._sync_conn(), lambda c: self._insert(c, rows), wait)

    def _rows(self, msgs: Iterable[Message]) -> list[tuple[Any, ...]]:
        """Encode (and size-check) before taking the write lock; keep only rows."""
        now = time.time()
        rows = []
        limit = self.max_message_size
        for m in msgs:
            scheduled = m.eta is not None and m.eta > now
            rows.append(
                (
                    m.id,
                    m.queue,
                    m.name,
                    m.kind,
                    "scheduled" if scheduled else "ready",
                    m.priority,
                    m.eta if scheduled else now,
                    now,
                    m.max_attempts,
                    m.key if m.kind == "task" else None,
                    encode_checked(m, limit),
                    m.key,
                    *((m.headers["unique"],) if "unique" in m.headers else ()),
                )
            )
        return rows

    def _insert_rows(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> int:
        """Insert (ignoring duplicates) in multi-row statements, and count what
        went in per queue and state from RETURNING: one counter update per
        batch, not a trigger per row."""
        added: Counter[tuple[str, str]] = Counter()
        for start in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[start : start + _INSERT_CHUNK]
            params = [v for r in chunk for v in r[:12]]
            values = ",".join(["(?,?,?,?,?,?,?,?,?,?,?,?)"] * len(chunk))
            added.update(
                conn.execute(
                    "INSERT OR IGNORE INTO dw_jobs (id, queue, name, kind, state, priority,"
                    f" run_at, updated_at, max_attempts, key, body, msg_key) VALUES {values}"
                    " RETURNING queue, state",
                    params,
                ).fetchall()
            )
        if added:
            conn.executemany(
                "INSERT INTO dw_counts (queue, state, n) VALUES (?,?,?)"
                " ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n",
                [(q, st, n) for (q, st), n in added.items()],
            )
        return sum(added.values())

    def _insert(
        self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]], remember: bool = True
    ) -> list[str]:
        for r in rows:
            mode = _UNIQUE_RELEASE.get(r[12]) if len(r) > 12 and r[9] is not None else None
            if mode:  # the key's holder no longer blocks: free the key for this job
                conn.execute(
                    f"UPDATE dw_jobs SET key=NULL WHERE key=? AND state IN {mode}", (r[9],)
                )
        inserted = self._insert_rows(conn, rows)
        new_queues = {r[1] for r in rows} - (self._known_queues if remember else set())
        if new_queues:
            conn.executemany(
                "INSERT OR IGNORE INTO dw_queues (name) VALUES (?)", [(q,) for q in new_queues]
            )
            if remember:  # not when the caller's transaction may still roll back
                self._known_queues |= new_queues
        ids = [r[0] for r in rows]
        keyed = any(r[9] is not None for r in rows)
        if keyed and inserted < len(rows):
            # some were duplicates: report the id of the job that holds each key
            keys = [r[9] for r in rows if r[9] is not None]
            found = dict(
                conn.execute(
                    "SELECT key, id FROM dw_jobs WHERE key IN (SELECT value FROM json_each(?))",
                    (orjson.dumps(keys),),
                ).fetchall()
            )
            ids = [found.get(r[9], r[0]) if r[9] is not None else r[0] for r in rows]
        return ids

    # -- events ------------------------------------------------------------------

    async def declare(self, queues: Sequence[str], bindings: Sequence[Binding] = ()) -> None:
        qs, bs = list(queues), list(bindings)
        await self._run(self._wtx, lambda c: self._declare(c, qs, bs))

    def _declare(self, c: sqlite3.Connection, queues: list[str], bindings: list[Binding]) -> None:
        c.executemany(
            "INSERT OR IGNORE INTO dw_queues (name) VALUES (?)",
            [(q,) for q in {*queues, *(b.queue for b in bindings)}],
        )
        c.executemany(
            "INSERT INTO dw_bindings (pattern, queue, max_attempts) VALUES (?,?,?)"
            " ON CONFLICT (pattern, queue) DO UPDATE SET max_attempts=excluded.max_attempts",
            [(b.pattern, b.queue, b.max_attempts) for b in bindings],
        )

    async def publish(self, msgs: Iterable[Message]) -> int:
        wait = deadline.remaining(self.busy_timeout)
        return await self._run(self._publish_worker_conn, msgs, wait)

    def _publish_worker_conn(self, msgs: Iterable[Message], wait: float) -> int:
        events = self._event_rows(msgs)
        conn = self._worker_conn(wait)
        conn.execute(f"PRAGMA synchronous={self.producer_sync}")
        try:
            return self._producer_tx(conn, lambda c: self._fan_out(c, events), wait)
        finally:
            conn.execute("PRAGMA synchronous=NORMAL")
            self._set_busy(conn, round(self.busy_timeout * 1000))

    def publish_sync(self, msgs: Iterable[Message]) -> int:
        events = self._event_rows(msgs)
        wait = deadline.remaining(self.busy_timeout)
        return self._producer_tx(self._sync_conn(), lambda c: self._fan_out(c, events), wait)

    def _event_rows(self, msgs: Iterable[Message]) -> list[tuple[Message, bytes]]:
        limit = self.max_message_size
        return [(m, encode_checked(m, limit)) for m in msgs]

    def _fan_out(
        self, c: sqlite3.Connection, events: list[tuple[Message, bytes]], remember: bool = True
    ) -> int:
        """Log each new event, then one job per bound queue, in one transaction."""
        now = time.time()
        bindings: dict[str, list[Binding]] = {}
        for pattern, queue, attempts in c.execute(
            "SELECT pattern, queue, max_attempts FROM dw_bindings"
        ):
            bindings.setdefault(pattern, []).append(Binding(pattern, queue, attempts))
        deliveries: list[Message] = []
        for m, body in events:
            cur = c.execute(
                "INSERT OR IGNORE INTO dw_events (id, type, published_at, body) VALUES (?,?,?,?)",
                (m.id, m.name, now, body),
            )
            if cur.rowcount == 1:  # a duplicate publish is not delivered again
                deliveries += [delivery_of(m, b, uuid7()) for b in bindings.get(m.name, ())]
        if deliveries:
            self._insert(c, self._rows(deliveries), remember)
        return len(deliveries)

    # -- the outbox's fast path: the caller's transaction on this very file ------

    async def owns_connection(self, sql: Sql) -> bool:
        return self.owns_connection_sync(sql) if not sql.is_async else False

    def owns_connection_sync(self, sql: Sql) -> bool:
        return sql.dialect == "sqlite" and sql.sqlite_path() == os.path.realpath(self.path)

    async def enqueue_with(self, sql: Sql, msgs: Sequence[Message]) -> None:
        raise NotImplementedError("async SQLite connections go through the outbox table")

    def enqueue_with_sync(self, sql: Sql, msgs: Sequence[Message]) -> None:
        conn = _driver_connection(sql)
        if conn.isolation_level is None and not conn.in_transaction:
            raise ConfigurationError(
                "app.outbox(conn) on an autocommit sqlite3 connection needs a transaction: "
                "BEGIN first, so the job commits (or rolls back) with your changes"
            )
        if not self._ready:  # their transaction may hold the lock: create what is missing in it
            _apply_schema(conn)
        tasks = [m for m in msgs if m.kind == "task"]
        events = [m for m in msgs if m.kind != "task"]
        if tasks:
            self._insert(conn, self._rows(tasks), remember=False)
        if events:
            self._fan_out(conn, self._event_rows(events), remember=False)

    async def list_events(
        self,
        event_type: str,
        since: float | None = None,
        until: float | None = None,
        cursor: str | None = None,
        limit: int = 500,
    ) -> tuple[list[Message], str | None]:
        def run() -> tuple[list[Message], str | None]:
            rows = (
                self._worker_conn()
                .execute(
                    "SELECT id, body FROM dw_events WHERE type=? AND id>?"
                    " AND published_at>=? AND published_at<=? ORDER BY id LIMIT ?",
                    (
                        event_type,
                        cursor or "",
                        since if since is not None else float("-inf"),
                        until if until is not None else float("inf"),
                        limit + 1,
                    ),
                )
                .fetchall()
            )
            page = [decode(bytes(body)) for _, body in rows[:limit]]
            return page, (page[-1].id if len(rows) > limit else None)

        return await self._run(run)

    async def fetch(
        self, queues: Sequence[str], limit: int, lease: float, wait: float, worker: str = ""
    ) -> list[Delivery]:
        if limit <= 0:
            return []
        args = (list(queues), limit, lease, worker)
        out, next_due = await self._claim_safely(*args)
        if out or wait <= 0:
            return out
        # Nothing ready: watch the WAL, check once more (a commit may have
        # landed before the watch), then sleep until a write or the next eta.
        deadline = time.monotonic() + wait
        waker = self._waker()
        while True:
            waker.arm()
            out, next_due = await self._claim_safely(*args)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            if next_due is not None:
                remaining = min(remaining, max(0.0, next_due - time.time()))
            await waker.wait(remaining)

    async def _claim_safely(
        self, queues: list[str], limit: int, lease: float, worker: str
    ) -> tuple[list[Delivery], float | None]:
        """A claim that can be cancelled: if the caller gives up while the claim
        runs on the broker thread, what it claimed is given back (uncharged)."""
        if self._executor is None:
            await self.open()
        assert self._executor is not None
        executor = self._executor
        fut = asyncio.get_running_loop().run_in_executor(
            executor, self._claim, queues, limit, lease, worker
        )
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:

            def give_back(f: asyncio.Future[tuple[list[Delivery], float | None]]) -> None:
                if f.cancelled() or f.exception() is not None or not f.result()[0]:
                    return
                with contextlib.suppress(RuntimeError):  # the broker was closed meanwhile
                    executor.submit(self._requeue, f.result()[0])

            fut.add_done_callback(give_back)
            raise

    def _waker(self) -> FileWaker:
        loop = asyncio.get_running_loop()
        waker = self._wakers.get(loop)
        if waker is None:
            waker = self._wakers[loop] = FileWaker(self.path + "-wal")
        return waker

    def _claim(
        self, queues: list[str], limit: int, lease: float, worker: str
    ) -> tuple[list[Delivery], float | None]:
        def run(c: sqlite3.Connection) -> tuple[list[Delivery], float | None]:
            now = time.time()
            c.execute(
                "UPDATE dw_jobs SET state='ready' WHERE state='scheduled' AND run_at<=?", (now,)
            )
            paused = {r[0] for r in c.execute("SELECT name FROM dw_queues WHERE paused=1")}
            token = secrets.randbits(62)
            until = now + lease
            rows: list[Any] = []
            for q in queues:
                if q in paused:
                    continue
                rows += c.execute(
                    "UPDATE dw_jobs SET state='running', attempt=attempt+1, token=?,"
                    " lease_until=?, worker=?, updated_at=? WHERE rowid IN (SELECT rowid"
                    " FROM dw_jobs WHERE state='ready' AND queue=?"
                    " ORDER BY priority DESC, run_at LIMIT ?)"
                    " RETURNING id, queue, attempt, body, errors, priority, run_at",
                    (token, until, worker, now, q, limit - len(rows)),
                ).fetchall()
                if len(rows) >= limit:
                    break
            next_due = None
            if not rows:
                r = c.execute("SELECT min(run_at) FROM dw_jobs WHERE state='scheduled'").fetchone()
                next_due = r[0]
            rows.sort(key=lambda r: (-r[5], r[6]))
            return [delivery_row(r, token, until) for r in rows], next_due

        return self._wtx(run)

    async def ack(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._ack, ds)

    def _ack(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [
            (
                now,
                d.result,
                now + max(self.retention, d.result_ttl or 0.0),
                d.id,
                d.token,
            )
            for d in ds
        ]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state='succeeded', updated_at=?, result=?, expires_at=?,"
                " lease_until=NULL, token=NULL WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def retry(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._retry, ds)

    def _retry(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [
            (
                "scheduled" if d.retry_at > now else "ready",
                max(d.retry_at, now),
                err_json(d),
                _err_type(d),
                now,
                d.id,
                d.token,
            )
            for d in ds
        ]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state=?, run_at=?,"
                " errors=CASE WHEN ?3 IS NULL THEN errors"
                " ELSE json_insert(coalesce(errors, '[]'), '$[#]', json(?3)) END,"
                " last_error_type=coalesce(?4, last_error_type), updated_at=?,"
                " lease_until=NULL, token=NULL WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def dead(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._dead, ds)

    def _dead(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [(err_json(d), _err_type(d), now, d.id, d.token) for d in ds]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state='dead',"
                " errors=CASE WHEN ?1 IS NULL THEN errors"
                " ELSE json_insert(coalesce(errors, '[]'), '$[#]', json(?1)) END,"
                " last_error_type=coalesce(?2, last_error_type), updated_at=?,"
                " lease_until=NULL, token=NULL WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def requeue(self, ds: Sequence[Delivery]) -> None:
        if ds:
            await self._run(self._requeue, ds)

    def _requeue(self, ds: Sequence[Delivery]) -> None:
        now = time.time()
        rows = [
            ("scheduled" if d.retry_at > now else "ready", max(d.retry_at, now), now, d.id, d.token)
            for d in ds
        ]
        self._wtx(
            lambda c: c.executemany(
                "UPDATE dw_jobs SET state=?, attempt=max(attempt-1, 0), run_at=?,"
                " updated_at=?, lease_until=NULL, token=NULL"
                " WHERE id=? AND token=? AND state='running'",
                rows,
            )
        )

    async def extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        if not ds:
            return []
        return await self._run(self._extend, ds, lease)

    def _extend(self, ds: Sequence[Delivery], lease: float) -> list[Delivery]:
        def run(c: sqlite3.Connection) -> list[Delivery]:
            until = time.time() + lease
            lost = []
            for d in ds:
                cur = c.execute(
                    "UPDATE dw_jobs SET lease_until=? WHERE id=? AND token=? AND state='running'",
                    (until, d.id, d.token),
                )
                if cur.rowcount == 1:
                    d.lease_until = until
                else:
                    lost.append(d)
            return lost

        return self._wtx(run)

    async def rescue(self) -> Rescued:
        return await self._run(self._rescue)

    def _rescue(self) -> Rescued:
        now = time.time()
        conn = self._worker_conn()
        # cheap read first: most calls find nothing and need no write lock
        expired = conn.execute(
            "SELECT 1 FROM dw_jobs WHERE state='running' AND lease_until<? LIMIT 1", (now,)
        ).fetchone()
        prunable = conn.execute(
            "SELECT 1 FROM dw_jobs WHERE expires_at<? UNION ALL"
            " SELECT 1 FROM dw_kv WHERE expires<? UNION ALL"
            " SELECT 1 FROM dw_events WHERE published_at<? LIMIT 1",
            (now, now, now - self.event_retention),
        ).fetchone()
        if not expired and not prunable:
            return Rescued()

        def run(c: sqlite3.Connection) -> Rescued:
            rows = c.execute(
                "SELECT id, attempt, max_attempts, coalesce(worker, ''), queue, name FROM dw_jobs"
                " WHERE state='running' AND lease_until<?",
                (now,),
            ).fetchall()
            dead: list[DeadLetter] = []
            for id_, attempt, max_attempts, worker, queue, name in rows:
                rec = ErrorRecord(
                    time=now,
                    type=_LEASE_EXPIRED,
                    message=f"lease expired: worker {worker or '?'} stopped heartbeating"
                    f" during attempt {attempt}",
                    worker=worker,
                    attempt=attempt,
                )
                err = orjson.dumps(rec.to_dict()).decode()
                buried = attempt >= max_attempts
                # a buried job's envelope goes with its report (on_dead hooks
                # log its arguments); only those rare rows return their body
                got = c.execute(
                    "UPDATE dw_jobs SET state=?, run_at=?, updated_at=?, lease_until=NULL,"
                    " token=NULL, errors=json_insert(coalesce(errors,'[]'),'$[#]',json(?)),"
                    " last_error_type=? WHERE id=? AND state='running'"
                    " RETURNING CASE WHEN state='dead' THEN body END, errors",
                    (
                        "dead" if buried else "ready",
                        now,
                        now,
                        err,
                        _LEASE_EXPIRED,
                        id_,
                    ),
                ).fetchall()  # run to its end: no statement left open in the transaction
                if buried and got:
                    [(body, errors)] = got
                    dead.append(
                        DeadLetter(
                            id_, queue, name, rec, stored_message(body, queue, attempt, errors)
                        )
                    )
            c.execute(
                "DELETE FROM dw_jobs WHERE rowid IN (SELECT rowid FROM dw_jobs"
                " WHERE expires_at<? LIMIT 5000)",
                (now,),
            )
            c.execute("DELETE FROM dw_kv WHERE expires<?", (now,))
            c.execute("DELETE FROM dw_events WHERE published_at<?", (now - self.event_retention,))
            return Rescued(len(rows), dead)

        return self._tx(conn, run)

    # -- admin -----------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        return await self._run(self._stats)

    def _stats(self) -> list[QueueStats]:
        c = self._worker_conn()
        now = time.time()
        counts: dict[str, dict[str, float]] = {}
        paused: set[str] = set()
        for name, is_paused in c.execute("SELECT name, paused FROM dw_queues"):
            counts[name] = {}
            if is_paused:
                paused.add(name)
        for queue, state, n in c.execute("SELECT queue, state, n FROM dw_counts"):
            counts.setdefault(queue, {})[state] = n  # kept by triggers: no row counting
        # per queue, so each min() is one probe of dw_jobs_ready_age
        for q, n in counts.items():
            if n.get("ready", 0) > 0:
                row = c.execute(
                    "SELECT min(run_at) FROM dw_jobs WHERE state='ready' AND queue=?", (q,)
                ).fetchone()
                if row[0] is not None:
                    n["lag"] = now - row[0]
        return stats_rows(counts, paused)

    async def list_jobs(
        self, filter: JobFilter, cursor: str | None = None, limit: int = 50
    ) -> Page:
        return await self._run(self._list, filter, cursor, limit)

    def _list(self, filter: JobFilter, cursor: str | None, limit: int) -> Page:
        where, params = _where(filter)
        if cursor is not None:
            where += " AND id < ?"
            params.append(cursor)
        rows = (
            self._worker_conn()
            .execute(
                f"SELECT {_INFO_COLS} FROM {_jobs(filter)} WHERE {where} ORDER BY id DESC LIMIT ?",
                [*params, limit + 1],
            )
            .fetchall()
        )
        items = [info_row(r) for r in rows[:limit]]
        return Page(items=items, cursor=items[-1].message.id if len(rows) > limit else None)

    async def get(self, id: str) -> JobInfo | None:
        return await self._run(self._get, id)

    def _get(self, id: str) -> JobInfo | None:
        row = (
            self._worker_conn()
            .execute(f"SELECT {_INFO_COLS} FROM dw_jobs WHERE id=?", (id,))
            .fetchone()
        )
        return None if row is None else info_row(row)

    def get_sync(self, id: str) -> JobInfo | None:
        """``get`` for sync callers (``Job.status()`` from a request handler)."""
        row = self._sync_conn().execute(f"SELECT {_INFO_COLS} FROM dw_jobs WHERE id=?", (id,))
        r = row.fetchone()
        return None if r is None else info_row(r)

    async def replay(self, filter: JobFilter) -> int:
        return await self._run(self._replay, filter)

    def _replay(self, filter: JobFilter) -> int:
        where, params = _where(filter)
        now = time.time()
        return self._wtx(
            lambda c: (
                c.execute(
                    f"UPDATE {_jobs(filter)} SET state='ready', attempt=0, run_at=?,"
                    " updated_at=?, replays=replays+1, expires_at=NULL"
                    f" WHERE state='dead' AND {where}",
                    [now, now, *params],
                ).rowcount
            )
        )

    async def purge(self, filter: JobFilter) -> int:
        return await self._run(self._purge, filter)

    def _purge(self, filter: JobFilter) -> int:
        where, params = _where(filter)
        return self._wtx(
            lambda c: (
                c.execute(
                    f"DELETE FROM {_jobs(filter)} WHERE state!='running' AND {where}", params
                ).rowcount
            )
        )

    async def cancel(self, ids: Sequence[str]) -> list[str]:
        return await self._run(self._cancel, list(ids))

    def _cancel(self, ids: list[str]) -> list[str]:
        now = time.time()
        return self._wtx(
            lambda c: [
                r[0]
                for r in c.execute(
                    "UPDATE dw_jobs SET state='cancelled', updated_at=?, expires_at=?"
                    " WHERE id IN (SELECT value FROM json_each(?))"
                    " AND state IN ('scheduled', 'ready') RETURNING id",
                    (now, now + self.retention, orjson.dumps(ids)),
                ).fetchall()
            ]
        )

    async def reschedule(self, ids: Sequence[str], at: float) -> list[str]:
        def run(c: sqlite3.Connection) -> list[str]:
            now = time.time()
            return [
                r[0]
                for r in c.execute(
                    "UPDATE dw_jobs SET state=CASE WHEN ?1 > ?2 THEN 'scheduled' ELSE 'ready' END,"
                    " run_at=max(?1, ?2), updated_at=?2"
                    " WHERE id IN (SELECT value FROM json_each(?3))"
                    " AND state IN ('scheduled', 'ready') RETURNING id",
                    (at, now, orjson.dumps(list(ids))),
                ).fetchall()
            ]

        return await self._run(self._wtx, run)

    async def pause(self, queue: str) -> None:
        await self._run(self._set_paused, queue, 1)

    async def resume(self, queue: str) -> None:
        await self._run(self._set_paused, queue, 0)

    def _set_paused(self, queue: str, paused: int) -> None:
        self._wtx(
            lambda c: c.execute(
                "INSERT INTO dw_queues (name, paused) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET paused=excluded.paused",
                (queue, paused),
            )
        )

    # -- coordination ------------------------------------------------------

    async def acquire(self, name: str, owner: str, ttl: float) -> int | None:
        return await self._run(self._acquire, name, owner, ttl)

    def _acquire(self, name: str, owner: str, ttl: float) -> int | None:
        def run(c: sqlite3.Connection) -> int | None:
            now = time.time()
            row = c.execute(
                "SELECT owner, token, expires FROM dw_locks WHERE name=?", (name,)
            ).fetchone()
            if row is not None and row[2] > now:
                if row[0] != owner:
                    return None
                c.execute("UPDATE dw_locks SET expires=? WHERE name=?", (now + ttl, name))
                return int(row[1])
            token = int(
                c.execute("UPDATE dw_meta SET v=v+1 WHERE k='fence' RETURNING v").fetchone()[0]
            )
            c.execute(
                "INSERT INTO dw_locks (name, owner, token, expires) VALUES (?,?,?,?)"
                " ON CONFLICT (name) DO UPDATE SET owner=excluded.owner,"
                " token=excluded.token, expires=excluded.expires",
                (name, owner, token, now + ttl),
            )
            return token

        return self._wtx(run)

    async def renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        return await self._run(self._renew, name, owner, token, ttl)

    def _renew(self, name: str, owner: str, token: int, ttl: float) -> bool:
        now = time.time()
        return bool(
            self._wtx(
                lambda c: (
                    c.execute(
                        "UPDATE dw_locks SET expires=? WHERE name=? AND owner=? AND token=?"
                        " AND expires>?",
                        (now + ttl, name, owner, token, now),
                    ).rowcount
                )
            )
        )

    async def release(self, name: str, owner: str, token: int) -> None:
        await self._run(
            lambda: self._wtx(
                lambda c: c.execute(
                    "DELETE FROM dw_locks WHERE name=? AND owner=? AND token=?",
                    (name, owner, token),
                )
            )
        )

    # -- key-value ---------------------------------------------------------------

    async def kv_get(self, keys: Sequence[str]) -> dict[str, bytes]:
        payload = orjson.dumps(list(keys))

        def run(c: sqlite3.Connection) -> dict[str, bytes]:
            rows = c.execute(
                "SELECT key, value FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
                " AND (expires IS NULL OR expires > ?)",
                (payload, time.time()),
            )
            return {k: bytes(v) for k, v in rows}

        return await self._quick(run, len(keys), write=False)

    async def kv_set(self, items: Mapping[str, bytes], ttl: float | None = None) -> None:
        expires = None if ttl is None else time.time() + ttl
        rows = [(k, bytes(v), expires) for k, v in items.items()]
        await self._quick(
            lambda c: c.executemany(
                "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                " DO UPDATE SET value=excluded.value, expires=excluded.expires",
                rows,
            ),
            len(rows),
        )

    async def kv_update(
        self,
        keys: Sequence[str],
        decide: Callable[[dict[str, bytes]], tuple[Mapping[str, KvWrite], T]],
    ) -> T:
        """One write transaction: the read, ``decide`` and the write, atomic
        against every other connection (on the caller's thread or one hop
        away, ``_quick``)."""
        payload = orjson.dumps(list(keys))

        def run(c: sqlite3.Connection) -> T:
            rows = c.execute(
                "SELECT key, value FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
                " AND (expires IS NULL OR expires > ?)",
                (payload, time.time()),
            )
            writes, out = decide({k: bytes(v) for k, v in rows})
            if writes:
                now = time.time()
                stored = []
                for k, v in writes.items():
                    data, ttl = kv_write(v)
                    stored.append((k, data, None if ttl is None else now + ttl))
                c.executemany(
                    "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                    " DO UPDATE SET value=excluded.value, expires=excluded.expires",
                    stored,
                ).close()
            return out

        return await self._quick(run, len(keys))

    async def kv_add(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            # one statement: an expired entry is taken over in place
            now = time.time()
            cur = c.execute(
                "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                " DO UPDATE SET value=excluded.value, expires=excluded.expires"
                " WHERE dw_kv.expires <= ?",
                (key, bytes(value), None if ttl is None else now + ttl, now),
            )
            return cur.rowcount == 1

        return await self._quick(run)

    async def kv_incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        def run(c: sqlite3.Connection) -> int:
            now = time.time()
            c.execute("DELETE FROM dw_kv WHERE key=? AND expires<=?", (key, now))
            row = c.execute(
                "INSERT INTO dw_kv (key, value, expires)"
                " VALUES (?, CAST(CAST(? AS TEXT) AS BLOB), ?) ON CONFLICT (key) DO UPDATE"
                " SET value=CAST(CAST(CAST(value AS INTEGER) + ? AS TEXT) AS BLOB)"
                " RETURNING value",
                (key, amount, None if ttl is None else now + ttl, amount),
            ).fetchone()
            return int(row[0])

        return await self._quick(run)

    async def kv_delete(self, keys: Sequence[str]) -> int:
        now = time.time()
        payload = orjson.dumps(list(keys))
        return await self._quick(
            lambda c: (
                c.execute(
                    "DELETE FROM dw_kv WHERE key IN (SELECT value FROM json_each(?))"
                    " AND (expires IS NULL OR expires > ?)",
                    (payload, now),
                ).rowcount
            ),
            len(keys),
        )

    async def kv_sadd(self, key: str, member: str, ttl: float | None = None) -> int:
        def run(c: sqlite3.Connection) -> int:
            now = time.time()
            c.execute("DELETE FROM dw_kv WHERE key=? AND expires<=?", (key, now))
            row = c.execute("SELECT value FROM dw_kv WHERE key=?", (key,)).fetchone()
            members = set(orjson.loads(row[0])) if row is not None else set()
            if member not in members:
                members.add(member)
                c.execute(
                    "INSERT INTO dw_kv (key, value, expires) VALUES (?,?,?) ON CONFLICT (key)"
                    " DO UPDATE SET value=excluded.value",
                    (key, orjson.dumps(sorted(members)), None if ttl is None else now + ttl),
                )
            return len(members)

        return await self._quick(run)

    async def kv_smembers(self, key: str) -> set[str]:
        raw = (await self.kv_get([key])).get(key)
        return set(orjson.loads(raw)) if raw is not None else set()

    async def kv_scan(self, prefix: str) -> dict[str, bytes]:
        def run() -> dict[str, bytes]:
            # a range on the primary key (not substr(), which scans every row)
            rows = self._worker_conn().execute(
                "SELECT key, value FROM dw_kv WHERE key >= ? AND key < ?"
                " AND (expires IS NULL OR expires > ?)",
                (prefix, prefix + "\U0010ffff", time.time()),
            )
            return {k: bytes(v) for k, v in rows if k.startswith(prefix)}

        return await self._run(run)

    # -- flow control ----------------------------------------------------------

    async def rate_limit(self, key: str, rate: int, per: float, at: float) -> float:
        def run(c: sqlite3.Connection) -> float:
            c.execute("DELETE FROM dw_rate WHERE key=? AND t<=?", (key, at - 2 * per))
            times = [
                r[0]
                for r in c.execute(
                    "SELECT t FROM dw_rate WHERE key=? AND t>? AND t<? ORDER BY t",
                    (key, at - per, at + per),
                )
            ]
            wait = window_wait(times, at, rate, per)
            if wait == 0.0:
                c.execute("INSERT INTO dw_rate (key, t) VALUES (?, ?)", (key, at))
            return wait

        return await self._quick(run)

    async def slot_acquire(self, key: str, limit: int, holder: str, ttl: float) -> bool:
        def run(c: sqlite3.Connection) -> bool:
            now = time.time()
            c.execute("DELETE FROM dw_slots WHERE key=? AND expires<=?", (key, now))
            held = c.execute(
                "SELECT count(*), sum(holder=?) FROM dw_slots WHERE key=?", (holder, key)
            ).fetchone()
            if not held[1] and held[0] >= limit:
                return False
            c.execute(
                "INSERT INTO dw_slots (key, holder, expires) VALUES (?,?,?)"
                " ON CONFLICT (key, holder) DO UPDATE SET expires=excluded.expires",
                (key, holder, now + ttl),
            )
            return True

        return await self._quick(run)

    async def slot_extend(self, holds: Sequence[tuple[str, str]], ttl: float) -> None:
        rows = [(time.time() + ttl, k, h) for k, h in holds]
        await self._quick(
            lambda c: c.executemany("UPDATE dw_slots SET expires=? WHERE key=? AND holder=?", rows),
            len(rows),
        )

    async def slot_release(self, holds: Sequence[tuple[str, str]]) -> None:
        rows = list(holds)
        await self._quick(
            lambda c: c.executemany("DELETE FROM dw_slots WHERE key=? AND holder=?", rows),
            len(rows),
        )


def _log_failure(fut: Future[None]) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("sqlite WAL checkpoint failed: %r (the next one tries again)", exc)


# -- row mapping -------------------------------------------------------------


def _driver_connection(sql: Sql) -> sqlite3.Connection:
    """The sqlite3 connection under the caller's (maybe SQLAlchemy) connection."""
    raw = sql.raw
    if isinstance(raw, sqlite3.Connection):
        return raw
    conn = raw.connection() if hasattr(raw, "get_bind") else raw  # a Session
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection)
    return driver


_INFO_COLS = (
    "id, queue, state, attempt, body, errors, run_at, updated_at, worker,"
    " lease_until, result, replays"
)


def _err_type(d: Delivery) -> str | None:
    return None if d.error is None else d.error.type


def _jobs(f: JobFilter) -> str:
    """The table an admin statement reads: by the key index when the filter has
    a key.  SQLite plans without statistics (nothing runs ANALYZE), and its
    default guesses rate an equality on two columns of (queue, state, id)
    above one on msg_key, so a key search within a queue and state would read
    that whole (queue, state) range; a key selects few jobs, so its index is
    always the one to read."""
    return "dw_jobs INDEXED BY dw_jobs_msg_key" if f.key is not None else "dw_jobs"


def _where(f: JobFilter) -> tuple[str, list[Any]]:
    return where(f, SQLITE)
