"""Connections to Redis: redis-py's connection objects (hiredis parser, TLS,
AUTH, SELECT), driven directly.

The broker makes few kinds of calls, nearly all ``EVALSHA``, and each one
matters on the hot path, so it skips redis-py's client and pool layers (about
a third of a call's cost here) and keeps its own free lists:

* ``AsyncLink``: the connections of one event loop.  A connection belongs to
  the loop that opened it, and the same broker is used from several (a
  worker's loop, the portal thread that runs ``job.status()``, a test's
  ``asyncio.run``), so the broker keeps one link per loop.
* ``SyncLink``: connections for sync producers, shared by their threads,
  with no event loop and no thread hop; dropped after a fork.

A call takes a free connection (or opens one), sends, reads, and puts it
back.  A failed connection is closed and not reused; the next call opens a
new one.  A connection blocked in ``BLPOP`` is simply checked out, so other
calls use other connections meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
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
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry

from .lua import Script

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
        # wrap every send in ``asyncio.wait_for`` (a task per call, a third
        # of a call's cost).  Reads get ``read_timeout`` instead, which costs
        # one timer.
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
    on its socket and reader (redis-py's own layers around them are about a
    third of the call's Python time); any other (not yet connected, or
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

    # -- one connection, driven step by step (bulk enqueue, see bulk.py) --------

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
    """Connections for sync callers, any thread; list pop/append are atomic."""

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

    def _call(self, args: tuple[Arg, ...]) -> Any:
        if self.pid != os.getpid() or self.generation != self.target.generation:
            # after a fork the parent's sockets are not ours to use (redis-py
            # does not shut them down from a child); after MOVED they point
            # at the wrong node
            self.free = []
            self.pid = os.getpid()
            self.generation = self.target.generation
        try:
            conn = self.free.pop()
        except IndexError:
            conn = self.target.new_sync()
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

    # -- one connection, driven step by step (bulk enqueue, see bulk.py) --------

    def checkout(self) -> Any:
        if self.pid != os.getpid() or self.generation != self.target.generation:
            self.free = []
            self.pid = os.getpid()
            self.generation = self.target.generation
        try:
            return self.free.pop()
        except IndexError:
            return self.target.new_sync()

    def checkin(self, conn: Any) -> None:
        self.free.append(conn)

    def discard(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            conn.disconnect()

    def send(self, conn: Any, cmd: tuple[Arg, ...]) -> None:
        conn.send_packed_command(_pack(conn, cmd), check_health=False)

    def read(self, conn: Any) -> Any:
        try:
            return conn.read_response(disable_decoding=True)
        except ResponseError as exc:
            return exc

    def close(self) -> None:
        conns, self.free = self.free, []
        if self.pid != os.getpid():
            return
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.disconnect()
