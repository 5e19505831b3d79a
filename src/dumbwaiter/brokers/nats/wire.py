"""One NATS connection with a lean path for dumbwaiter's hot traffic.

nats-py keeps what is hard to get right: connecting (TLS, user and token
auth, several servers), pings, reconnecting with backoff and subscribing
again afterwards.  Its per-message path is slow for a job queue, though:
every received message passes a regular expression, an ``async`` call, a
header dictionary, a ``Msg`` object, an ``asyncio.Queue`` and a task switch,
and the receive buffer is shifted after each message; ``js.publish`` adds a
timer and a JSON dataclass per call (docs/benchmarks.md, "Private hooks", has
what the path below saves).

So ``Wire`` plugs two things into the nats-py client it creates (its own
instance; nats-py's classes and modules are left alone, and so are other
clients of the process):

* the ``parser`` hook: a protocol parser (``protocol._Parser``) that takes over that
  client's ``_ps``: it walks
  each read buffer once and calls a plain function for the subscriptions
  registered here (``subscribe``), with the raw subject, reply, header block
  and payload; every other subscription (the JetStream management calls made
  through nats-py's own API) still goes to nats-py's ``_process_msg``;
* the ``send`` hook: publishing by appending protocol commands to the
  client's own pending buffer (``publish``, ``request``, ``batch``) and
  writing them once per batch (``flush``), so a batch of a thousand
  publishes is a few socket writes and keeps its order with everything else
  the client sends.

Either hook can be turned off (``DUMBWAITER_HOOKS_OFF``, brokers/hooks.py),
and both are off on a nats-py that lacks what they use: the messages then go
through nats-py's public ``subscribe`` callbacks and ``publish``, with the
same handlers and the same results.

Requests share one wildcard inbox subscription: a reply names its request by
the last token of its subject.  While the connection is down, ``request``
raises ``Unavailable`` at once instead of letting nats-py buffer the command
for later: a caller that gave up must not have its write replayed behind its
back after the reconnect.  Outstanding requests fail with ``Unavailable`` when
the connection drops and with ``BrokerError`` after ``timeout`` seconds.

The hooks use nats-py internals of that one client (``_ps``, ``_pending``,
``_transport``, ``_process_msg``, ``_process_ping`` and friends), checked at
connect; the ``nats`` extra pins the minor releases they are tested with
(``.ci/clients.sh`` runs the suites against the oldest and the newest).  nats-py
is imported with this module, not at the first connect, so an app without
the extra fails at ``App()`` with ``MissingDependency`` like every broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import orjson
from nats.aio.client import Client

from ...errors import BrokerAuthError
from .. import hooks
from .protocol import (
    Handler,
    JetStreamError,
    Reply,
    Unavailable,
    _Parser,
    header_block,
    header_dict,
    pub_cmd,
    refused_login,
)

log = logging.getLogger("dumbwaiter.nats")


#: bytes waiting in the socket's buffer above which ``flush`` waits for it to drain
_HIGH_WATER = 4 * 1024 * 1024

#: what each hook uses of the client (both check that it is there)
_PARSER_USES = ("_ps", "_process_msg", "_process_ping", "_process_pong", "_process_err",
                "_process_info")  # fmt: skip
_SEND_USES = ("_pending", "_pending_data_size", "_transport")


class ReplyBatch:
    """Replies of a batch of requests (``Wire.batch``), in request order."""

    __slots__ = ("fut", "left", "replies")

    def __init__(self, fut: asyncio.Future[list[Reply]], n: int) -> None:
        self.fut = fut
        self.left = n
        self.replies: list[Reply] = [Reply(None, b"")] * n

    async def wait(self) -> list[Reply]:
        return await self.fut


async def _abandon(attempt: asyncio.Future[Any], nc: Any) -> None:
    """Stop nats-py's connect ``attempt`` and close its client.  The cancel
    is repeated until the attempt ends: ``asyncio.wait_for`` (inside
    nats-py's connect) can lose a cancel that meets a failed try on Python
    3.11, and nats-py would then go on trying."""
    while not attempt.done():
        attempt.cancel()
        await asyncio.wait({attempt}, timeout=0.1)
    if not attempt.cancelled():
        attempt.exception()  # retrieved: no "exception was never retrieved"
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 5.0)


def _abort_on_close(nc: Any, abort: bool) -> None:
    """Make closing this client's socket drop what it has not sent (an
    abortive close: ``SO_LINGER`` 0), or send it first (the default).

    nats-py closes the socket of a connection it gave up on (no PONG in
    time: a cable cut, a host gone) and connects anew.  A graceful close
    leaves the kernel retransmitting what was written into the dead
    connection, and after the network heals the server receives it behind
    everything the new connection sent: pull requests made during the cut
    take messages for a connection nobody reads (those jobs wait out
    ``AckWait``), and older writes (the holder list) land after newer ones.
    Aborted, the old connection's unsent commands are gone, as a caller that
    saw them fail expects (see the module doc).  Our own ``close`` lets them
    out.  (Only this client's socket; a transport without one is left as it is.)"""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", int(abort), 0))


def _has(nc: Any, names: tuple[str, ...]) -> bool:
    return all(hasattr(nc, name) for name in names)


class Wire:
    """A nats-py client with the fast path described in the module doc."""

    def __init__(
        self,
        servers: list[str],
        options: dict[str, Any],
        timeout: float,
        on_disconnect: Callable[[], None] | None = None,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.servers = servers
        self.options = options
        #: seconds a request waits for its reply
        self.timeout = timeout
        self._on_disconnect = on_disconnect
        self._on_reconnect = on_reconnect
        self.nc: Any = None
        self._fast: dict[int, Handler] = {}
        self._prefix = b"_INBOX.dw" + secrets.token_hex(8).encode() + b"."
        self._next = 0
        #: outstanding requests: token -> (future, deadline)
        self._pending: dict[bytes, tuple[asyncio.Future[Reply], float]] = {}
        #: outstanding batched requests: token -> (batch, index); batch -> deadline
        self._slots: dict[bytes, tuple[ReplyBatch, int]] = {}
        self._batches: dict[ReplyBatch, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        #: why the last connect (or reconnect) failed, for the error a
        #: caller that stops waiting for it raises
        self.last_error: BaseException | None = None
        self._write_soon = False
        self._wrote_this_turn = False
        #: the hooks this connection uses (``connect`` decides)
        self.parser_hook = False
        self.send_hook = False
        #: without the send hook: (subject, payload, reply, headers) for
        #: nats-py's ``publish``, in order, and the task publishing them
        self._out: list[tuple[str, bytes, str, dict[str, str] | None]] = []
        self._publisher: asyncio.Task[None] | None = None
        #: our subscriptions by sid (ours without the parser hook)
        self._subs: dict[int, Any] = {}
        self._sids = 0

    # -- connection ---------------------------------------------------------------

    async def connect(self, timeout: float) -> None:
        """Connect, giving up after ``timeout`` seconds (``Unavailable``, with
        the last reason nats-py met) or as soon as the server refuses the
        credentials (``BrokerAuthError``).  nats-py's own first connect, with
        the unbounded reconnects the connection keeps afterwards, would try
        an unreachable server, or a wrong password, for ever."""
        refused: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        where = ", ".join(self.servers)

        async def on_error(exc: Exception) -> None:
            log.debug("nats: %s", exc)
            if not self.connected:  # the first connect (or a reconnect) failed
                self.last_error = exc
                if refused_login(exc) and not refused.done():
                    refused.set_result(exc)

        async def on_disconnected() -> None:
            if not self._closed:
                log.warning("nats: the connection to %s was lost; connecting again", where)
            self._fail_all(Unavailable("the connection to NATS was lost"))
            if self._on_disconnect is not None:
                self._on_disconnect()

        async def on_reconnected() -> None:
            _abort_on_close(self.nc, True)
            url = self.nc.connected_url
            log.info("nats: reconnected to %s", getattr(url, "netloc", url))
            if self._on_reconnect is not None:
                self._on_reconnect()

        nc: Any = Client()
        self.parser_hook = hooks.on("parser") and _has(nc, _PARSER_USES)
        self.send_hook = hooks.on("send") and _has(nc, _SEND_USES)
        if self.parser_hook:  # this client's parser only (the module doc)
            nc._ps = _Parser(nc, self._fast)
        self.nc = nc
        attempt = asyncio.ensure_future(
            nc.connect(
                servers=self.servers,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **self.options,
            )
        )
        try:
            await asyncio.wait(
                {attempt, refused}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not attempt.done():  # timed out, refused or cancelled: stop trying
                await _abandon(attempt, nc)
        if refused.done():
            login = refused.result()
            raise BrokerAuthError(f"cannot connect to NATS at {where}: {login}") from login
        if attempt.cancelled():
            last = self.last_error
            why = str(last) if last else f"no answer within {timeout:.1f} s"
            raise Unavailable(f"cannot connect to NATS at {where}: {why}") from last
        exc = attempt.exception()
        if exc is not None:
            raise Unavailable(f"cannot connect to NATS at {where}: {exc}") from exc
        _abort_on_close(nc, True)
        sid = await self._subscribe(self._prefix.decode() + "*", self._on_reply)
        self._fast[sid] = self._on_reply
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._publisher is not None:
            self._publisher.cancel()
            self._publisher = None
        self._out.clear()
        self._fail_all(Unavailable("the broker was closed"))
        if self.nc is not None and not self.nc.is_closed:
            _abort_on_close(self.nc, False)  # our own close: what is queued goes out
            try:
                await self.nc.close()
            except Exception:
                log.debug("nats: close failed", exc_info=True)

    def abandon(self) -> None:
        """Drop the connection of a loop that is closed (``asyncio.run`` ended).

        Its transport can no longer be closed the normal way (closing
        schedules a callback on the dead loop) and left alone it would warn
        "unclosed transport" when collected, so its socket is closed here."""
        self._closed = True
        nc = self.nc
        if nc is None:
            return
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        transport = getattr(writer, "transport", None)
        if transport is not None:
            with contextlib.suppress(RuntimeError):  # "Event loop is closed"
                transport.abort()
            sock = getattr(transport, "_sock", None)
            if sock is not None:
                sock.close()
                transport._sock = None
        with contextlib.suppress(Exception):
            nc._status = nc.CLOSED

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def max_payload(self) -> int:
        return int(self.nc.max_payload) if self.nc is not None else 1024 * 1024

    def check(self) -> None:
        """Raise ``Unavailable`` unless connected (see the module doc)."""
        if self.nc is None or not self.nc.is_connected:
            if self._closed or (self.nc is not None and self.nc.is_closed):
                raise Unavailable("the connection to NATS is closed")
            raise Unavailable("not connected to NATS (reconnecting)")

    async def wait_connected(self, timeout: float) -> bool:
        """Wait until connected (or ``timeout``); True if connected."""
        deadline = time.monotonic() + timeout
        while not self.connected:
            if self._closed or (self.nc is not None and self.nc.is_closed):
                return False
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    # -- sending -------------------------------------------------------------------

    def _queue(self, subject: bytes, data: bytes, reply: bytes, hdr: bytes | None) -> None:
        """Queue one publish for the next ``flush``: its protocol command in
        the client's buffer (the send hook), or for nats-py's ``publish``."""
        if self.send_hook:
            cmd = pub_cmd(subject, data, reply, hdr)
            nc = self.nc
            nc._pending.append(cmd)
            nc._pending_data_size += len(cmd)
        else:
            self._out.append((subject.decode(), data, reply.decode(), header_dict(hdr)))

    def publish(
        self, subject: bytes, data: bytes, hdr: bytes | None = None, reply: bytes = b""
    ) -> None:
        """Queue a publish (sent by the next ``flush``): acks to JetStream,
        pull requests whose answers go to ``reply``, ..."""
        self.check()
        self._queue(subject, data, reply, hdr)

    async def flush(self) -> None:
        """Write everything queued to the socket: the first flush of an event
        loop turn at once, later ones of the same turn together at its end.

        So a lone request pays no extra turn, and a thousand request handlers
        that each enqueue a job in one turn share two ``send`` calls instead
        of making a thousand.  (nats-py's own flush wakes its flusher task, a
        turn or two later.)  Writing from here is safe: the flusher copies and
        clears the buffer without an await in between, on this same loop, and
        both write in queue order.  Backpressure stays nats-py's: this waits
        while the socket's buffer is over its high-water mark."""
        nc = self.nc
        if not self.send_hook:
            await self._publish_out()
            return
        if nc is None or not nc._pending_data_size:
            return
        if not self._wrote_this_turn:
            self._wrote_this_turn = True
            loop = asyncio.get_running_loop()
            loop.call_soon(self._turn_over)
            self._write()
        elif not self._write_soon:
            self._write_soon = True
            asyncio.get_running_loop().call_soon(self._write)
        transport = nc._transport
        writer = getattr(transport, "_io_writer", None)
        if writer is not None and writer.transport.get_write_buffer_size() > _HIGH_WATER:
            await transport.drain()

    def write_now(self) -> None:
        """``flush`` for code that cannot await: the same rules, no backpressure wait."""
        nc = self.nc
        if not self.send_hook:
            if self._out and (self._publisher is None or self._publisher.done()):
                self._publisher = asyncio.get_running_loop().create_task(self._publish_out())
            return
        if nc is None or not nc._pending_data_size:
            return
        if not self._wrote_this_turn:
            self._wrote_this_turn = True
            asyncio.get_running_loop().call_soon(self._turn_over)
            self._write()
        elif not self._write_soon:
            self._write_soon = True
            asyncio.get_running_loop().call_soon(self._write)

    def _turn_over(self) -> None:
        self._wrote_this_turn = False

    async def _publish_out(self) -> None:
        """Without the send hook: everything queued, in order, through
        nats-py's ``publish`` (which wakes its flusher task).  A publish that
        fails (the connection broke, nats-py's buffer is full while it
        reconnects) is dropped, as a write into a broken socket is: its
        request times out."""
        nc = self.nc
        while self._out and nc is not None:
            out, self._out = self._out, []
            for subject, data, reply, headers in out:
                try:
                    await nc.publish(subject, data, reply=reply, headers=headers)
                except Exception:
                    log.debug("nats: publish to %s failed", subject, exc_info=True)

    def _write(self) -> None:
        self._write_soon = False  # (also when called at once: a scheduled one finds nothing)
        nc = self.nc
        if nc is None or not nc._pending_data_size:
            return
        transport = nc._transport
        if not nc.is_connected or transport is None:
            return  # reconnecting: nats-py writes its buffer once connected
        pending, nc._pending = nc._pending, []
        nc._pending_data_size = 0
        try:
            transport.writelines(pending)
        except Exception:  # the connection broke: nats-py notices and reconnects
            log.debug("nats: write failed", exc_info=True)

    def request(
        self, subject: bytes, data: bytes, hdr: bytes | None = None, timeout: float | None = None
    ) -> asyncio.Future[Reply]:
        """Queue a request; the future gets its reply.  Call ``flush`` after a batch."""
        self.check()
        self._next += 1
        token = b"%x" % self._next
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[token] = (fut, time.monotonic() + (timeout or self.timeout))
        self._queue(subject, data, self._prefix + token, hdr)
        return fut

    async def call(
        self, subject: bytes, data: bytes, hdr: bytes | None = None, timeout: float | None = None
    ) -> Reply:
        fut = self.request(subject, data, hdr, timeout)
        await self.flush()
        return await fut

    def batch(self, items: list[tuple[bytes, bytes, bytes | None]]) -> ReplyBatch:
        """Queue one request per (subject, data, header block); ``ReplyBatch.wait``
        returns every reply in order.  One future for the whole batch: a bulk
        enqueue makes two requests per job."""
        self.check()
        b = ReplyBatch(asyncio.get_running_loop().create_future(), len(items))
        if not items:
            b.fut.set_result(b.replies)
            return b
        deadline = time.monotonic() + self.timeout
        prefix = self._prefix
        slots = self._slots
        n = self._next
        queue = self._queue
        for i, (subject, data, hdr) in enumerate(items):
            n += 1
            token = b"%x" % n
            slots[token] = (b, i)
            queue(subject, data, prefix + token, hdr)
        self._next = n
        self._batches[b] = deadline
        return b

    async def gather(self, futs: list[asyncio.Future[Reply]]) -> list[Reply | BaseException]:
        """Flush, then wait for every reply; failures are returned, not raised."""
        await self.flush()
        out: list[Reply | BaseException] = []
        for f in futs:
            try:
                out.append(await f)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                out.append(exc)
        return out

    async def api(self, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """One JetStream API call (``$JS.API.<path>``); raise ``JetStreamError`` on its error."""
        payload = b"" if body is None else orjson.dumps(body)
        r = await self.call(b"$JS.API." + path.encode(), payload, None, timeout)
        if r.status == 503:
            raise Unavailable(f"JetStream API {path}: no answer (503: JetStream not ready?)")
        d = orjson.loads(r.data) if r.data else {}
        err = d.get("error")
        if err is not None and int(err.get("code", 0)) == 503:
            raise Unavailable(f"JetStream API {path}: {err.get('description', err)}")
        if err is not None:
            raise JetStreamError(
                f"JetStream API {path}: {err.get('description', err)}",
                int(err.get("code", 0)),
                int(err.get("err_code", 0)),
            )
        return d

    # -- receiving -----------------------------------------------------------------

    async def subscribe(self, subject: str, handler: Handler) -> int:
        """Subscribe with a fast handler; nats-py keeps the subscription across reconnects."""
        sid = await self._subscribe(subject, handler)
        self._fast[sid] = handler
        return sid

    async def _subscribe(self, subject: str, handler: Handler) -> int:
        if self.parser_hook:

            async def never(_msg: Any) -> None:  # the parser hands our messages to ``handler``
                return None

            sub = await self.nc.subscribe(subject, cb=never)
            sid = int(sub._id)  # the number the parser sees in MSG lines
        else:

            async def adapt(msg: Any) -> None:  # nats-py's Msg, as the hook would hand it
                try:
                    hdr = header_block(msg.headers)
                    handler(msg.subject.encode(), msg.reply.encode(), hdr, msg.data)
                except Exception:
                    log.exception("nats: handler of %s failed", subject)

            sub = await self.nc.subscribe(subject, cb=adapt)
            self._sids += 1
            sid = self._sids
        self._subs[sid] = sub
        return sid

    async def unsubscribe(self, sid: int) -> None:
        self._fast.pop(sid, None)
        sub = self._subs.pop(sid, None)
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception:
                log.debug("nats: unsubscribe %d failed", sid, exc_info=True)

    def new_inbox(self) -> bytes:
        self._next += 1
        return self._prefix[:-1] + b"s%x" % self._next

    def _on_reply(self, subject: bytes, reply: bytes, hdr: bytes | None, data: bytes) -> None:
        token = subject[len(self._prefix) :]
        slot = self._slots.pop(token, None)
        if slot is not None:
            b, i = slot
            b.replies[i] = Reply(hdr, data)
            b.left -= 1
            if not b.left:
                self._batches.pop(b, None)
                if not b.fut.done():
                    b.fut.set_result(b.replies)
            return
        entry = self._pending.pop(token, None)
        if entry is not None and not entry[0].done():
            entry[0].set_result(Reply(hdr, data))

    def _fail_all(self, exc: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            _fail(fut, exc)
        batches, self._batches, self._slots = self._batches, {}, {}
        for b in batches:
            _fail(b.fut, exc)

    async def _sweep(self) -> None:
        """Fail requests whose reply did not come within their timeout."""
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            late = [t for t, (_, deadline) in self._pending.items() if deadline <= now]
            for token in late:
                fut, _ = self._pending.pop(token)
                _fail(fut, Unavailable("NATS request timed out (no reply)"))
            for b in [b for b, deadline in self._batches.items() if deadline <= now]:
                del self._batches[b]
                _fail(b.fut, Unavailable("NATS request timed out (no reply)"))


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail a request; marked as seen, since a caller that gave up on its batch
    at an earlier failure never awaits the rest (their awaiters still raise)."""
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()
