"""Connections of the PostgreSQL broker: URL options, pools, the LISTEN connection.

* The **sync** pool (``psycopg_pool.ConnectionPool``) serves ``enqueue_sync``:
  sync producers in any thread borrow a connection without an event-loop hop.
* The **async** side keeps one small pool per event loop.  A psycopg
  ``AsyncConnection`` belongs to the loop that opened it, and one broker
  object is used from several loops: the worker's, the App's portal thread
  (``job.status()`` from sync code), and a fresh loop per ``asyncio.run`` in
  the CLI and in tests.  ``psycopg_pool.AsyncConnectionPool`` runs its own
  tasks on one loop and cannot be closed once that loop has ended, so each
  loop gets a ``LoopPool`` (a few lines: idle connections and a semaphore),
  and the pool of a loop that has ended is closed without it (libpq's
  ``finish`` is synchronous).
* One ``LISTEN`` connection per loop wakes idle fetches; it reconnects with
  backoff, and while it is down, fetches poll.

A connection whose socket turns readable while it sits idle was closed by the
server (a restart, ``pg_terminate_backend``, an idle timeout): it is dropped
at checkout instead of failing the next statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import select
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import pq
from psycopg_pool import PoolTimeout

from ...errors import InvalidURL

log = logging.getLogger("dumbwaiter.postgres")

#: the server's reason for refusing a connection, in libpq's message
_FATAL = re.compile(r"FATAL:\s+(.+)")
#: reasons that are about who connects: the role, its password, pg_hba.conf
_AUTH = ("password authentication failed", "no pg_hba.conf entry", "permission denied")

#: options of ours in the URL's query string; the rest goes to libpq
_OPTIONS = (
    "schema",
    "pool_min",
    "pool_max",
    "sync_pool_max",
    "migrate",
    "retention",
    "prune_interval",
    "prepare_threshold",
    "poll_interval",
    "worker_sync_commit",
    "reconnect",
)


@dataclass(frozen=True, slots=True)
class Options:
    """What a ``postgresql://`` URL says beyond where the server is."""

    conninfo: str
    schema: str = "public"
    #: connections the sync producers' pool keeps open (and opens at start)
    pool_min: int = 1
    #: most connections per event loop
    pool_max: int = 10
    #: most connections of the sync producer pool
    sync_pool_max: int = 10
    #: "auto": apply pending migrations on connect (development, tests)
    migrate: str = "check"
    #: seconds a finished job (succeeded or cancelled) is kept
    retention: float = 3600.0
    #: seconds between prunes by the maintenance leader
    prune_interval: float = 10.0
    #: statements are prepared on the server after this many runs (None: never;
    #: PgBouncer before 1.21 in transaction mode needs never)
    prepare_threshold: int | None = 5
    #: seconds between polls of an idle fetch while LISTEN is down
    poll_interval: float = 0.5
    #: synchronous_commit of a worker's own transitions (claims, outcomes,
    #: heartbeats): "off" trades a rerun after a server crash for a disk flush
    #: per batch; "on" (or "local", "remote_apply"...) flushes each
    worker_sync_commit: str = "off"
    #: seconds an enqueue keeps retrying while the server is unreachable, when
    #: no producer call's deadline (``App(enqueue_timeout=)``) says otherwise
    reconnect: float = 15.0


def parse_url(url: str) -> Options:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidURL(f"not a PostgreSQL URL: {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OPTIONS}
    rest = [(k, v) for k, v in query if k not in _OPTIONS]
    if not any(k == "application_name" for k, _ in rest):
        rest.append(("application_name", "dumbwaiter"))
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
    try:
        prepare = ours.pop("prepare_threshold", "5")
        opts = Options(
            conninfo=conninfo,
            schema=ours.pop("schema", "public"),
            pool_min=int(ours.pop("pool_min", 1)),
            pool_max=int(ours.pop("pool_max", 10)),
            sync_pool_max=int(ours.pop("sync_pool_max", 10)),
            migrate=ours.pop("migrate", "check").lower(),
            retention=float(ours.pop("retention", 3600.0)),
            prune_interval=float(ours.pop("prune_interval", 10.0)),
            prepare_threshold=None if prepare.lower() in ("", "none", "off") else int(prepare),
            poll_interval=float(ours.pop("poll_interval", 0.5)),
            worker_sync_commit=ours.pop("worker_sync_commit", "off").lower(),
            reconnect=float(ours.pop("reconnect", 15.0)),
        )
    except ValueError as exc:
        raise InvalidURL(f"bad option in PostgreSQL URL {_redact(url)!r}: {exc}") from None
    if opts.worker_sync_commit not in ("off", "local", "remote_write", "on", "remote_apply"):
        raise InvalidURL(
            f"worker_sync_commit= takes a synchronous_commit value, not {opts.worker_sync_commit!r}"
        )
    if opts.migrate not in ("check", "auto"):
        raise InvalidURL(f"migrate= takes 'check' or 'auto', not {opts.migrate!r}")
    if not opts.schema or len(opts.schema) > 50:
        raise InvalidURL(f"schema= must name a schema of 1 to 50 characters: {opts.schema!r}")
    if opts.pool_max < 2 or opts.sync_pool_max < 1 or not 0 <= opts.pool_min <= opts.sync_pool_max:
        raise InvalidURL(
            "pool sizes: need pool_max >= 2, sync_pool_max >= 1, 0 <= pool_min <= sync_pool_max"
        )
    return opts


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


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


def recording(report: Callable[[BaseException | None], None]) -> type[psycopg.Connection[Any]]:
    """A connection class (for ``ConnectionPool(connection_class=)``) that
    reports how each connect went to ``report`` (its error, or None): the
    pool connects in its own threads, and a caller that times out waiting
    for it would otherwise learn only "couldn't get a connection", not why."""

    class Recording(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:
            try:
                conn = super().connect(conninfo, **kwargs)
            except psycopg.Error as exc:
                report(exc)
                raise
            report(None)
            return conn

    return Recording


def looks_closed(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True if an idle connection cannot be used: closed, broken, or its socket
    is readable (the server said goodbye, or closed it, while we were idle)."""
    if conn.closed or conn.broken:
        return True
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def check_sync(conn: psycopg.Connection[Any]) -> None:
    """``check`` callback of the sync pool: cheap, no round trip.  A dead
    connection is closed here, so the pool discards it and opens another
    (unclosed, the pool would take it back as it is and hand it out again)."""
    if looks_closed(conn):
        _finish(conn)
        raise psycopg.OperationalError("connection closed by the server while idle")


class LoopPool:
    """Connections of one event loop, at most ``size`` of them at once."""

    def __init__(self, connect: Callable[[], Any], size: int) -> None:
        self._connect = connect
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._sem = asyncio.Semaphore(size)
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self._sem:
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if looks_closed(candidate):
                    await _aclose(candidate)
                    continue
                conn = candidate
                break
            if conn is None:
                conn = await self._connect()
            try:
                yield conn
            finally:
                self._give_back(conn)

    def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        reusable = (
            not self._closed
            and not conn.closed
            and not conn.broken
            and conn.info.transaction_status == pq.TransactionStatus.IDLE
        )
        if reusable:
            self._idle.append(conn)
        else:  # mid-query (cancelled), broken, or pool closed: never reuse
            _finish(conn)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _aclose(conn)

    def abandon(self) -> None:
        """Close without the loop (it has ended): libpq's finish is synchronous."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            _finish(conn)


async def _aclose(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:  # closing a dead connection may complain; it is closed either way
        _finish(conn)


def _finish(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Close a connection without awaiting anything (safe from any loop or none)."""
    with contextlib.suppress(Exception):
        conn.pgconn.finish()
