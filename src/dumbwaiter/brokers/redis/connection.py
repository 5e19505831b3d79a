"""Connections to Redis: redis-py's connection objects (hiredis parser, TLS,
AUTH, SELECT), driven directly, and the ``Connection`` every other part of
the broker talks through.

The broker makes few kinds of calls, nearly all ``EVALSHA``, and each one
matters on the hot path, so it skips redis-py's client and pool layers
(docs/benchmarks-redis.md has their cost) and keeps its own free lists:

* ``AsyncLink``: the connections of one event loop.  A connection belongs to
  the loop that opened it, and the same broker is used from several (a
  worker's loop, the portal thread that runs ``job.status()``, a test's
  ``asyncio.run``), so ``Connection.links`` keeps one link per loop, through
  the ``PerLoop`` registry every engine shares.
* ``SyncLink``: connections for sync producers, shared by their threads,
  with no event loop and no thread hop; dropped after a fork.

A call takes a free connection (or opens one), sends, reads, and puts it
back.  A failed connection is closed and not reused; the next call opens a
new one.  A connection blocked in ``BLPOP`` is simply checked out, so other
calls use other connections meanwhile.

Multi-step exchanges (a bulk enqueue's pipeline, a publish) are written
once, as generators of I/O requests, and ``bulk.drive`` runs them on either
link: a ``SyncLink``'s steps are coroutines that never suspend, so
``bulk.run_sync`` finishes the same driver in the caller's thread, with no
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from redis import connection as sync_connection
from redis.asyncio import connection as async_connection
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from ...errors import BrokerError
from .. import failure as failures
from ..clock import ServerClock
from ..deadline import Backoff
from ..perloop import PerLoop
from .lua import Script, scripts

log = logging.getLogger("dumbwaiter.redis")

_NOT_ENOUGH: Any
try:  # what redis-py's hiredis reader answers while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH
except ImportError:  # pragma: no cover - other redis-py versions: hiredis' default
    _NOT_ENOUGH = False

#: errors after which the same call may simply be sent again later: the
#: server is unreachable, restarting (``LOADING``), failing over (``READONLY``
#: from a demoted primary) or resharding (``TRYAGAIN``, ``CLUSTERDOWN``)
TRANSIENT: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    OSError,
)

#: errors no retry can mend: the server refuses the URL's credentials
#: (``AuthenticationError`` is a ``ConnectionError`` to redis-py, so these
#: are caught before ``TRANSIENT``)
PERMANENT: tuple[type[BaseException], ...] = (AuthenticationError, NoPermissionError)
#: errors of a connection that never got an answer: the node may be gone
UNREACHABLE: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)

Arg = bytes | str | int | float

# No CLIENT SETINFO round trips when connecting: redis-py 7+ takes
# ``driver_info=None`` (and warns about the older ``lib_name``/``lib_version``).
_NO_CLIENT_INFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(sync_connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


class Target:
    """Where to connect: host, port, db, TLS and auth, from the URL.

    ``moved`` follows a Redis Cluster ``MOVED`` reply: every key of an app
    lives in one hash slot, so the broker only ever needs the node that owns
    it, and after a failover or resharding it re-points to the new owner.
    ``unreachable`` goes back to the URL's node when the node ``MOVED`` sent
    us to stops answering: a primary that failed is gone until someone
    restarts it, and only another node can name the replica that took over
    (the URL's node answers ``MOVED`` with it once the cluster has
    promoted it)."""

    def __init__(self, url: str, socket_timeout: float, connect_timeout: float) -> None:
        common: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "socket_keepalive": True,
            **_NO_CLIENT_INFO,
        }
        akw: dict[str, Any] = dict(async_connection.parse_url(url))
        skw: dict[str, Any] = dict(sync_connection.parse_url(url))  # type: ignore[no-untyped-call]
        self.async_class: type[async_connection.AbstractConnection] = akw.pop(
            "connection_class", async_connection.Connection
        )
        # redis-py's sync connection is untyped: Any keeps mypy --strict quiet
        self.sync_class: Any = skw.pop("connection_class", sync_connection.Connection)
        # Async connections get no socket timeout of their own: redis-py would
        # wrap every send in ``asyncio.wait_for``, a task per call
        # (docs/benchmarks-redis.md has its cost).  Reads get
        # ``read_timeout`` instead, which costs one timer.
        self.read_timeout = socket_timeout
        self.async_kwargs = {**common, **akw, "socket_timeout": None}
        self.sync_kwargs = {**common, **skw}
        self.generation = 0
        #: the URL's node (host, port)
        self.seed: tuple[Any, Any] = (self.async_kwargs.get("host"), self.async_kwargs.get("port"))

    def moved(self, host: str, port: int) -> None:
        for kw in (self.async_kwargs, self.sync_kwargs):
            kw["host"] = host
            kw["port"] = port
        self.generation += 1  # links drop connections made to the old node

    def unreachable(self, exc: BaseException) -> None:
        """A connection failed with ``exc``: if it was to a node ``MOVED``
        named, ask the URL's node again."""
        if not isinstance(exc, UNREACHABLE):
            return
        host, port = self.seed
        if (self.async_kwargs.get("host"), self.async_kwargs.get("port")) != self.seed:
            self.moved(host, port)

    def new_async(self) -> async_connection.AbstractConnection:
        # no retries inside redis-py: the broker decides when to try again
        return self.async_class(**self.async_kwargs, retry=AsyncRetry(NoBackoff(), 0))

    def new_sync(self) -> Any:
        return self.sync_class(**self.sync_kwargs, retry=SyncRetry(NoBackoff(), 0))


_hiredis_pack: Any
try:  # hiredis packs a command in C; redis-py's own packer is the fallback
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - the extra installs hiredis
    _hiredis_pack = None


def _pack(conn: Any, args: tuple[Arg, ...]) -> list[bytes]:
    if _hiredis_pack is not None:
        return [_hiredis_pack(args)]
    return list(conn.pack_command(*args))


def _roundtrip(conn: Any, packed: list[bytes]) -> Any:
    """Send one packed command on a sync connection and read its reply.

    A sync enqueue is one round trip, so what wraps the two syscalls counts:
    a connected connection with redis-py's hiredis parser is driven straight
    on its socket and reader, skipping redis-py's own layers around them
    (docs/benchmarks-redis.md has their cost); any other (not yet connected, or
    without hiredis) goes through redis-py.  The errors are redis-py's: error
    replies raise as its ``ResponseError`` subclasses (``NoScriptError``,
    ``MovedError``...), a lost or timed-out socket as its ``ConnectionError`` /
    ``TimeoutError``, so callers cannot tell the two paths apart."""
    sock = getattr(conn, "_sock", None)
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    buffer = getattr(parser, "_buffer", None)
    if sock is None or reader is None or buffer is None:
        conn.send_packed_command(packed, check_health=False)
        return conn.read_response(disable_decoding=True)
    try:
        for item in packed:
            sock.sendall(item)
        reply = reader.gets(False)
        while reply is _NOT_ENOUGH or reply is False:
            n = sock.recv_into(buffer)
            if not n:
                raise RedisConnectionError("Connection closed by server.")
            reader.feed(buffer, 0, n)
            reply = reader.gets(False)
    except TimeoutError as exc:
        raise RedisTimeoutError(f"Timeout talking to redis: {exc}") from exc
    except OSError as exc:
        raise RedisConnectionError(f"Error talking to redis: {exc}") from exc
    if isinstance(reply, ResponseError | RedisConnectionError):
        raise reply
    return reply


def _evalsha(script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> tuple[Arg, ...]:
    return (b"EVALSHA", script.sha, len(keys), *keys, *args)


def _eval(script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> tuple[Arg, ...]:
    return (b"EVAL", script.source, len(keys), *keys, *args)


class AsyncLink:
    """The connections of one event loop."""

    def __init__(self, target: Target, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self.loop = loop
        self.free: list[async_connection.AbstractConnection] = []
        self.generation = target.generation

    async def call(self, *args: Arg, timeout: float | None = None) -> Any:
        """Send one command and return its reply (bytes, not decoded)."""
        for _ in range(3):
            try:
                return await self._call(args, timeout)
            except MovedError as exc:
                self.target.moved(exc.host, exc.port)
        return await self._call(args, timeout)

    async def _call(self, args: tuple[Arg, ...], timeout: float | None) -> Any:
        if self.generation != self.target.generation:
            await self.aclose()
            self.generation = self.target.generation
        conn = self.free.pop() if self.free else self.target.new_async()
        try:
            await conn.send_packed_command(_pack(conn, args), check_health=False)
            reply = await conn.read_response(
                disable_decoding=True,
                timeout=self.target.read_timeout if timeout is None else timeout,
            )
        except ResponseError:
            self.free.append(conn)  # the server answered: the connection is fine
            raise
        except BaseException as exc:
            # lost, timed out or cancelled half-way: the reply may still come,
            # so this connection can never be trusted again
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            self.target.unreachable(exc)
            raise
        self.free.append(conn)
        return reply

    async def script(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        try:
            return await self.call(*_evalsha(script, keys, args))
        except NoScriptError:
            return await self.call(*_eval(script, keys, args))

    # -- one connection, driven step by step (see ``bulk.drive``) ---------------

    async def checkout(self) -> Any:
        if self.generation != self.target.generation:
            await self.aclose()
            self.generation = self.target.generation
        return self.free.pop() if self.free else self.target.new_async()

    def checkin(self, conn: Any) -> None:
        self.free.append(conn)

    async def discard(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)

    async def send(self, conn: Any, cmd: tuple[Arg, ...]) -> None:
        await conn.send_packed_command(_pack(conn, cmd), check_health=False)

    async def read(self, conn: Any) -> Any:
        """The next reply; an error reply is returned (not raised), so the
        replies of a pipeline can all be read."""
        try:
            return await conn.read_response(disable_decoding=True, timeout=self.target.read_timeout)
        except ResponseError as exc:
            return exc

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def aclose(self) -> None:
        conns, self.free = self.free, []
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.disconnect()

    def abandon(self) -> None:
        """Drop the connections of a loop that is closed (``asyncio.run`` ended).

        Their transports can no longer be closed the normal way (closing
        schedules a callback on the dead loop), and left alone they would
        warn "unclosed transport" when collected, so their sockets are
        closed here directly."""
        conns, self.free = self.free, []
        for conn in conns:
            _close_on_dead_loop(conn)


def _close_on_dead_loop(conn: async_connection.AbstractConnection) -> None:
    writer = getattr(conn, "_writer", None)
    if writer is None:
        return
    transport = writer.transport
    with contextlib.suppress(RuntimeError):  # "Event loop is closed"
        transport.abort()
    sock = getattr(transport, "_sock", None)
    if sock is not None:  # abort could not finish on the dead loop
        sock.close()
        transport._sock = None
    conn._writer = conn._reader = None


class SyncLink:
    """Connections for sync callers, any thread; list pop/append are atomic.

    ``call`` and ``script`` block in the caller's thread.  The steps
    ``bulk.drive`` uses (``checkout``... ``sleep``) are coroutines with the
    ``AsyncLink``'s names that block instead of suspending, so one driver
    serves both links (``bulk.run_sync``)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.free: list[Any] = []  # redis-py's (untyped) sync connections
        self.pid = os.getpid()
        self.generation = target.generation

    def call(self, *args: Arg) -> Any:
        for _ in range(3):
            try:
                return self._call(args)
            except MovedError as exc:
                self.target.moved(exc.host, exc.port)
        return self._call(args)

    def _free_or_new(self) -> Any:
        if self.pid != os.getpid() or self.generation != self.target.generation:
            # after a fork the parent's sockets are not ours to use (redis-py
            # does not shut them down from a child); after MOVED they point
            # at the wrong node
            self.free = []
            self.pid = os.getpid()
            self.generation = self.target.generation
        try:
            return self.free.pop()
        except IndexError:
            return self.target.new_sync()

    def _call(self, args: tuple[Arg, ...]) -> Any:
        conn = self._free_or_new()
        try:
            reply = _roundtrip(conn, _pack(conn, args))
        except ResponseError:
            self.free.append(conn)  # the server answered: the connection is fine
            raise
        except BaseException as exc:
            with contextlib.suppress(Exception):
                conn.disconnect()
            self.target.unreachable(exc)
            raise
        self.free.append(conn)
        return reply

    def script(self, script: Script, keys: Sequence[Arg], args: Sequence[Arg]) -> Any:
        try:
            return self.call(*_evalsha(script, keys, args))
        except NoScriptError:
            return self.call(*_eval(script, keys, args))

    # -- one connection, driven step by step (see ``bulk.drive``) ---------------

    async def checkout(self) -> Any:
        return self._free_or_new()

    def checkin(self, conn: Any) -> None:
        self.free.append(conn)

    async def discard(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.disconnect()

    async def send(self, conn: Any, cmd: tuple[Arg, ...]) -> None:
        conn.send_packed_command(_pack(conn, cmd), check_health=False)

    async def read(self, conn: Any) -> Any:
        try:
            return conn.read_response(disable_decoding=True)
        except ResponseError as exc:
            return exc

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - blocks by design: see the class docstring

    def close(self) -> None:
        conns, self.free = self.free, []
        if self.pid != os.getpid():
            return
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.disconnect()


class Keys:
    """The names of one keyspace's keys, as the Python side uses them.

    Every key of a keyspace starts with its hash tag: ``{dw:NAME}`` for the
    app's home keyspace, ``{dw:NAME/q:QUEUE}`` for a queue of its own
    (``layout=queues``, see ``layout.py``), so a Redis Cluster keeps each
    keyspace in one slot and multi-key scripts are legal there.  The scripts
    get the tag as ``KEYS[1]`` and name the rest from it
    (``scripts/_core.lua``); the few keys Python reads or writes itself are
    named here, so the naming can change in one place."""

    def __init__(self, name: str) -> None:
        #: the hash tag every key of this keyspace starts with
        self.tag = f"{{dw:{name}}}"
        #: ``KEYS`` of every script call
        self.scripts: tuple[Arg, ...] = (self.tag,)

    def job(self, id: str) -> str:
        """The hash of one job's fields."""
        return f"{self.tag}:job:{id}"

    def inbox(self, waiter: str) -> str:
        """An idle fetch's inbox (``BLPOP``)."""
        return f"{self.tag}:in:{waiter}"

    def waiters(self, queue: str) -> str:
        """The idle fetches registered for ``queue``."""
        return f"{self.tag}:waiters:{queue}"


def failure(
    url: str, exc: BaseException, what: str = "", waited: float | None = None
) -> BrokerError:
    """``exc`` (redis-py's, or a socket's) as the ``BrokerError`` it means:
    refused credentials or a missing database number (for good), an
    unreachable or restarting server (for now), anything else."""
    if isinstance(exc, PERMANENT):
        return failures.refused(url, exc, auth=True)
    if isinstance(exc, ResponseError) and "DB index is out of range" in str(exc):
        return failures.refused(url, exc)
    if isinstance(exc, TRANSIENT):
        return failures.unavailable(url, exc, waited)
    return failures.failed(url, exc, f"redis {what}" if what else "redis")


class Connection:
    """One keyspace's way to its server: where (``target``), its keys,
    the scripts, one ``AsyncLink`` per event loop and the ``SyncLink``, and
    how writes are confirmed and retried (``reconnect``, ``wait_replicas``,
    ``wait_timeout``: the broker's URL options)."""

    def __init__(
        self,
        url: str,
        target: Target,
        name: str,
        *,
        reconnect: float,
        wait_replicas: int,
        wait_timeout: float,
    ) -> None:
        #: the broker's URL, for error messages (masked where shown)
        self.url = url
        self.target = target
        self.keys = Keys(name)
        self.lua = scripts()
        self.links: PerLoop[AsyncLink] = PerLoop(
            lambda loop: AsyncLink(target, loop), AsyncLink.aclose, AsyncLink.abandon
        )
        self.sync = SyncLink(target)
        #: seconds an enqueue keeps trying while the server is unreachable
        self.reconnect = reconnect
        #: an enqueue returns only once this many replicas have its writes
        #: (``WAIT``), or fails after ``wait_timeout`` seconds
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        #: the server's clock (``TIME``), which every time written here is on
        self.clock = ServerClock()

    def failure(
        self, exc: BaseException, what: str = "", waited: float | None = None
    ) -> BrokerError:
        return failure(self.url, exc, what, waited)

    async def now(self) -> float:
        """The server's time (``clock.py``): leases, expiries and run times
        compare on it, whatever this host's wall clock says."""
        await self.clock.sync(self.server_time)
        return self.clock.now()

    async def read_clock(self) -> None:
        """Read the server's clock when due, for the parts that stamp times
        without awaiting (bulk.py, events.py)."""
        await self.clock.sync(self.server_time)

    def read_clock_sync(self) -> None:
        """``read_clock`` for sync producers, on the ``SyncLink``."""
        self.clock.sync_blocking(self.server_time_sync)

    async def server_time(self) -> float:
        try:
            sec, usec = await self.links.get().call(b"TIME")
        except RedisError as exc:
            raise self.failure(exc, "time") from exc
        return int(sec) + int(usec) / 1e6

    def server_time_sync(self) -> float:
        try:
            sec, usec = self.sync.call(b"TIME")
        except RedisError as exc:
            raise self.failure(exc, "time") from exc
        return int(sec) + int(usec) / 1e6

    async def run(self, script: Script, args: Sequence[Arg]) -> Any:
        """One script call on this loop's link; redis-py's errors as ``BrokerError``."""
        try:
            return await self.links.get().script(script, self.keys.scripts, args)
        except RedisError as exc:
            raise self.failure(exc, script.name) from exc

    def pause_or_raise(self, backoff: Backoff, exc: BaseException, what: str) -> float:
        """After a ``TRANSIENT`` error: how long to wait before trying
        ``what`` again; or raise, when the server refused the credentials
        (``PERMANENT``: no retry mends that) or the deadline passed
        (``BrokerUnavailable``, naming the server and ``exc``)."""
        pause = None if isinstance(exc, PERMANENT) else backoff.pause()
        if pause is None:
            raise self.failure(exc, what, backoff.waited) from exc
        log.warning("redis %s failed (%s); trying again in %.2f s", what, exc, pause)
        return pause

    def wait(self) -> tuple[Arg, ...]:
        """The ``WAIT`` command that follows writes with ``wait_replicas``."""
        return (b"WAIT", self.wait_replicas, int(self.wait_timeout * 1000))

    def confirmed(self, reply: Any, what: str, again: str) -> None:
        """Replicas that acknowledged this connection's writes (``WAIT``'s
        reply): fewer than ``wait_replicas`` is an error."""
        got = int(checked(reply))
        if got < self.wait_replicas:
            raise BrokerError(
                f"redis {what}: stored on the primary, but only {got} of "
                f"{self.wait_replicas} replicas confirmed it within {self.wait_timeout} s "
                f"({again} again is safe)"
            )

    async def close(self) -> None:
        await self.links.close()
        self.sync.close()


def checked(reply: Any) -> Any:
    """A reply ``read`` returned, with an error reply raised."""
    if isinstance(reply, BaseException):
        raise reply
    return reply
