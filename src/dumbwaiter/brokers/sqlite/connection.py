"""The SQLite broker's connections, which every part of it shares.

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
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from ...errors import BrokerError, ConfigurationError
from .. import deadline, failure
from ..base import Broker
from ..perloop import PerLoop
from .options import BUSY_TIMEOUT, RETENTION, SYNC, SYNCHRONOUS, parse_url
from .schema import apply_schema, check_version
from .wake import FileWaker

T = TypeVar("T")
log = logging.getLogger("dumbwaiter.sqlite")

#: key-value calls of at most this many keys may run on the caller's thread
#: (``SQLiteConnection._quick``): one job's call (an enqueue's record, a lone
#: admission) is cheaper there than a hop, but a batch's is better left to
#: the broker's thread, where sqlite3 steps without the GIL while the event
#: loop goes on (measured: docs/sqlite.md)
QUICK_KEYS = 4
#: commits on callers' threads between two WAL checkpoints, which run on the
#: broker's thread (a checkpoint fsyncs: it must not stall an event loop)
QUICK_CHECKPOINT = 1000
#: a claim that finds the write lock taken polls it this often (seconds) ...
CLAIM_LOCK_POLL = 0.0001
#: ... for at most this long, then leaves the rest of the wait to SQLite's
#: busy handler (``_begin_claim``)
CLAIM_LOCK_SPIN = 0.005
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


class SQLiteConnection(Broker):
    """What the parts of the SQLite broker share (see the module docstring)."""

    client_errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error,)

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.path, opts = parse_url(url)
        self.retention = opts[RETENTION]
        self.busy_timeout = opts[BUSY_TIMEOUT]
        self.producer_sync = SYNC[opts[SYNCHRONOUS]]
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._aconn: sqlite3.Connection | None = None
        #: each event loop's watch of the WAL file (transport.py: idle fetches)
        self._wakers: PerLoop[FileWaker] = PerLoop(self._new_waker, _close_waker, FileWaker.close)
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
        """Create what is missing, once per broker; refuse a database this
        version cannot use (schema.py), before waiting for the write lock."""
        check_version(conn, self.path)
        conn.execute("BEGIN IMMEDIATE")
        try:
            apply_schema(conn, self.path)
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

    def _quick_statement(self, sql: str, params: tuple[Any, ...]) -> int | None:
        """One write statement run alone in autocommit on the caller's
        thread: its row count, or None when it must go the ``_quick`` way
        (no quick connection yet, a batch's size, the write lock taken).

        A statement outside a transaction is one by itself: SQLite takes
        the write lock for it as ``BEGIN IMMEDIATE`` would (a busy lock
        fails it before anything is written; the quick connection does not
        wait) and commits it when it ends, or rolls it back whole.  So a
        single upsert needs neither the ``BEGIN IMMEDIATE`` nor the
        ``COMMIT`` statement, two of ``_quick``'s three round trips into
        sqlite3."""
        conn = self._quick_conn()
        if conn is None:
            return None
        try:
            cur = conn.execute(sql, params)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF not in _BUSY:
                raise
            return None
        rows = cur.rowcount
        cur.close()
        self._quick_wrote()
        return rows

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

    def _tx(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[sqlite3.Connection], T],
        begin: Callable[[sqlite3.Connection], None] | None = None,
    ) -> T:
        """One write transaction.

        A cursor that ``fn`` returns (``lambda c: c.executemany(...)``) is
        closed here, on the connection's thread: left open, it would be
        dropped on the event loop's thread, and CPython's sqlite3 resets the
        cursor's cached statement when it is collected, racing the next
        transaction that runs the same statement on the broker's thread.
        That race is the SQLITE_MISUSE (InterfaceError) seen under load; should
        CPython report one anyway, the transaction was rolled back whole, so it
        is run once more.  ``begin`` opens the transaction when the plain
        ``BEGIN IMMEDIATE`` (which waits through the busy handler) will not
        do (``_begin_claim``)."""
        for attempt in (1, 2):
            if begin is None:
                conn.execute("BEGIN IMMEDIATE")
            else:
                begin(conn)
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

    def _claim_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A claim's write transaction on the broker thread's connection,
        opened by ``_begin_claim``."""
        return self._tx(self._worker_conn(), fn, self._begin_claim)

    def _begin_claim(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` for a claim, polling a taken write lock every
        ``CLAIM_LOCK_POLL`` s for up to ``CLAIM_LOCK_SPIN`` s before leaving the
        rest of the wait to SQLite's busy handler.

        An idle worker is woken by a producer's first write to the WAL
        (wake.py), which comes before that producer's commit has synced the
        WAL and let go of the lock; its claim then finds the lock taken.
        SQLite's own busy handler tries again only after sleeping 1 ms (then
        2, 5, 10 ms ...), while the commit it waits for ends a fraction of a
        millisecond later: every job handed to an idle worker waited out that
        sleep, or not, depending on whether the claim came before or after
        the producer's sync.  Polling the lock finely for a few milliseconds
        claims the job as soon as the commit ends; a lock held longer (a
        bulk enqueue, another worker's claim) is waited for as before."""
        self._set_busy(conn, 0)
        try:
            until = time.monotonic() + CLAIM_LOCK_SPIN
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorcode & 0xFF not in _BUSY:
                        raise
                if time.monotonic() >= until:
                    break
                time.sleep(CLAIM_LOCK_POLL)
        finally:
            self._set_busy(conn, round(self.busy_timeout * 1000))
        conn.execute("BEGIN IMMEDIATE")

    # -- open, close -------------------------------------------------------

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
        await self._wakers.close()
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

    def _as_producer(self, fn: Callable[[sqlite3.Connection], T], wait: float) -> T:
        """A producer's transaction (``fn``) on the broker thread's connection.

        Enqueues and publishes from async producers share that connection;
        they must be as durable as sync ones, so the producers' ``synchronous``
        for this transaction, and the worker's own calls get ``NORMAL`` and
        the full busy timeout back after it."""
        conn = self._worker_conn(wait)
        conn.execute(f"PRAGMA synchronous={self.producer_sync}")
        try:
            return self._producer_tx(conn, fn, wait)
        finally:
            conn.execute("PRAGMA synchronous=NORMAL")
            self._set_busy(conn, round(self.busy_timeout * 1000))

    def _new_waker(self, loop: asyncio.AbstractEventLoop) -> FileWaker:
        return FileWaker(self.path + "-wal")


async def _close_waker(waker: FileWaker) -> None:
    waker.close()


def _log_failure(fut: Future[None]) -> None:
    exc = fut.exception()
    if exc is not None:
        log.warning("sqlite WAL checkpoint failed: %r (the next one tries again)", exc)
