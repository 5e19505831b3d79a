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
from urllib.parse import urlencode, urlsplit

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from ...errors import InvalidURL
from ...redact import mask_url
from .. import urlopts

log = logging.getLogger("dumbwaiter.postgres")

#: the server's reason for refusing a connection, in libpq's message
_FATAL = re.compile(r"FATAL:\s+(.+)")
#: reasons that are about who connects: the role, its password, pg_hba.conf
_AUTH = ("password authentication failed", "no pg_hba.conf entry", "permission denied")


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


def _prepare(text: str) -> int | None:
    if text.lower() in ("", "none", "off"):
        return None
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _libpq_keys() -> frozenset[str]:
    """Every connection parameter this libpq knows (``sslmode``, ``options``...)."""
    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


SCHEMA = urlopts.text(
    "schema",
    "public",
    "the schema holding dumbwaiter's tables",
    pattern=r".{1,50}",
    accepts="a schema name of 1 to 50 characters",
)
MIGRATE = urlopts.choice("migrate", "check", ("check", "auto"), "apply pending migrations?")
RETENTION = urlopts.seconds("retention", 3600.0, "seconds a finished job is kept")
PRUNE_INTERVAL = urlopts.seconds("prune_interval", 10.0, "seconds between prunes", positive=True)
POOL_MAX = urlopts.integer("pool_max", 10, "most connections per event loop and pool", low=2)
POOL_MIN = urlopts.integer("pool_min", 1, "connections the sync pool keeps open")
SYNC_POOL_MAX = urlopts.integer("sync_pool_max", 10, "most connections of the sync pool", low=1)
PREPARE_THRESHOLD: urlopts.Option[int | None] = urlopts.custom(
    "prepare_threshold",
    5,
    "runs before a statement is prepared on the server",
    _prepare,
    "a whole number of 0 or more, or none",
)
POLL_INTERVAL = urlopts.seconds(
    "poll_interval", 0.5, "seconds between polls while LISTEN is down", positive=True
)
WORKER_SYNC_COMMIT = urlopts.choice(
    "worker_sync_commit",
    "off",
    ("off", "local", "remote_write", "on", "remote_apply"),
    "synchronous_commit of a worker's own transitions",
)
RECONNECT = urlopts.seconds(
    "reconnect", 15.0, "seconds an enqueue keeps retrying while the server is unreachable"
)
#: ours, then the libpq parameters checked here before libpq sees them (any
#: other libpq parameter passes unchecked: libpq's parser knows them)
OPTIONS = urlopts.Table(
    "PostgreSQL",
    [
        SCHEMA,
        MIGRATE,
        RETENTION,
        PRUNE_INTERVAL,
        POOL_MAX,
        POOL_MIN,
        SYNC_POOL_MAX,
        PREPARE_THRESHOLD,
        POLL_INTERVAL,
        WORKER_SYNC_COMMIT,
        RECONNECT,
        urlopts.text(
            "application_name", "dumbwaiter", "name in pg_stat_activity", passthrough=True
        ),
        urlopts.choice(
            "sslmode",
            "prefer",
            ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
            "TLS to the server",
            passthrough=True,
        ),
        urlopts.integer("connect_timeout", 0, "seconds to connect (0: no limit)", passthrough=True),
    ],
    client="libpq",
    other_keys=_libpq_keys,
    others="any other libpq connection parameter (target_session_attrs, sslrootcert...)",
    host_required=False,  # no host: libpq's Unix socket
    several=True,
)


def parse_url(url: str) -> Options:
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidURL(f"not a PostgreSQL URL: {mask_url(url)!r}")
    ours = OPTIONS.parse(url)
    rest = list(ours.client)
    if "application_name" not in ours.given:
        rest.append(("application_name", "dumbwaiter"))
    # written out, not with urlunsplit, which drops the "//" of a URL without
    # a host (``postgresql:///db``: libpq's Unix socket)
    conninfo = f"postgresql://{parts.netloc}{parts.path}?{urlencode(rest)}"
    try:  # libpq's own parser: the URI's syntax, and the keys only it knows
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise InvalidURL(f"PostgreSQL URL {mask_url(url)!r}: {str(exc).strip()}") from None
    opts = Options(
        conninfo=conninfo,
        schema=ours[SCHEMA],
        pool_min=ours[POOL_MIN],
        pool_max=ours[POOL_MAX],
        sync_pool_max=ours[SYNC_POOL_MAX],
        migrate=ours[MIGRATE],
        retention=ours[RETENTION],
        prune_interval=ours[PRUNE_INTERVAL],
        prepare_threshold=ours[PREPARE_THRESHOLD],
        poll_interval=ours[POLL_INTERVAL],
        worker_sync_commit=ours[WORKER_SYNC_COMMIT],
        reconnect=ours[RECONNECT],
    )
    if opts.pool_min > opts.sync_pool_max:
        raise InvalidURL(
            f"PostgreSQL URL {mask_url(url)!r}: pool_min ({opts.pool_min}) is more than "
            f"sync_pool_max ({opts.sync_pool_max})"
        )
    return opts


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
