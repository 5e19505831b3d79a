"""Deliveries read off the socket before aiormq's frame reader sees them.

aiormq reads every frame with three ``readexactly`` calls into a
``BytesIO`` under a lock and decodes it with pamqp's generic unmarshal; a
delivery is three frames (``Basic.Deliver``, content header, body), and on
a worker draining small jobs that reading is the largest share of the event
loop's time a job (docs/benchmarks.md, "RabbitMQ drain").  aiormq opens its
socket through a ``TransportFactory``, a public argument of its
``Connection``; ``Factory`` is ours: the connection's bytes arrive in
``Wire.feed``, which cuts them into frames and hands each delivery of a
consumer the link registered (``Wire.consumers``) straight to it, decoded
here with pamqp's field-table decoder for any value type but the usual ones.
Every other frame goes on, byte for byte and in order, to aiormq's reader
(``readexactly`` / ``read`` / ``at_eof``, as ``asyncio.StreamReader``).

A delivery is taken here only when nothing is ahead of it: no bytes wait
for aiormq's reader and the consumer channel's frame queue is empty, so a
``ConsumeOk``, ``CancelOk``, ``GetOk`` or an earlier delivery aiormq is
reading is never overtaken.  One aiormq has read but hands over later (by
a task, or a ``basic_get`` that has yet to resume) may still come after a
later one taken here: ``tags.py`` keeps the link's acks right then.  A delivery whose header carries
properties ``_header`` does not read goes aiormq's way whole.  aiormq
counts a connection stuck when no frame reached it for three heartbeats;
while every frame is a delivery taken here, a heartbeat frame is passed on
every ``KEEPALIVE`` seconds (the server did send something: the
connection is alive).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import Any, cast

import pamqp.constants
from aiormq.connection import TransportFactory
from pamqp import commands as spec
from pamqp.decode import TABLE_MAPPING

#: what a consumer registered with ``Wire`` is called with: delivery tag,
#: redelivered, body, headers, message id
Consumer = Callable[[int, bool, bytes, dict[str, Any], str], None]

_HEAD = struct.Struct(">BHI")
_HEAD_SIZE = 7
_INDEX = struct.Struct(">I")
_TAG = struct.Struct(">Q")
_HEADER_HEAD = struct.Struct(">HHQH")
_LONG = struct.Struct(">I")
_INT = struct.Struct(">i")
_LONGLONG = struct.Struct(">q")
_METHOD, _HEADER = pamqp.constants.FRAME_METHOD, pamqp.constants.FRAME_HEADER
_BODY, _END = pamqp.constants.FRAME_BODY, pamqp.constants.FRAME_END
_DELIVER = spec.Basic.Deliver.index
_P = spec.Basic.Properties
_CONTENT_TYPE, _ENCODING, _HEADERS = (
    _P.flags["content_type"],
    _P.flags["content_encoding"],
    _P.flags["headers"],
)
_MODE, _PRIORITY, _MESSAGE_ID = (
    _P.flags["delivery_mode"],
    _P.flags["priority"],
    _P.flags["message_id"],
)
#: the properties ``_header`` reads (the ones dumbwaiter's copies and
#: RabbitMQ's dead-lettering set); a delivery with any other goes to aiormq
_FAST = _CONTENT_TYPE | _ENCODING | _HEADERS | _MODE | _PRIORITY | _MESSAGE_ID
#: a heartbeat frame, as the server sends it
HEARTBEAT = bytes((pamqp.constants.FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, _END))
#: seconds between the heartbeats passed to aiormq while deliveries are taken here
KEEPALIVE = 5.0
#: bytes waiting for aiormq's reader above which the socket stops being read
HIGH_WATER = 1 << 20
#: no complete frame yet: wait for more bytes
_INCOMPLETE = -1


class _Unreadable(Exception):
    """A delivery ``Wire`` does not read itself: it goes to aiormq whole."""


def _table(buf: bytearray, at: int) -> tuple[int, dict[str, Any]]:
    """A field table at ``buf[at:]`` and where it ends, read as pamqp's
    ``decode.field_table`` reads it: long strings, 8/32/64-bit integers and
    booleans here, other types by pamqp's decoder of the type."""
    end = at + 4 + _LONG.unpack_from(buf, at)[0]
    if end > len(buf):
        raise _Unreadable("field table longer than its frame")
    at += 4
    out: dict[str, Any] = {}
    while at < end:
        n = buf[at]
        key = buf[at + 1 : at + 1 + n].decode()
        at += 1 + n
        kind = buf[at]
        at += 1
        value: Any
        if kind == 83:  # 'S'
            n = _LONG.unpack_from(buf, at)[0]
            raw = bytes(buf[at + 4 : at + 4 + n])
            try:
                value = raw.decode()
            except UnicodeDecodeError:
                value = raw
            at += 4 + n
        elif kind == 98:  # 'b'
            value = buf[at] - 256 if buf[at] > 127 else buf[at]
            at += 1
        elif kind == 73:  # 'I'
            value = _INT.unpack_from(buf, at)[0]
            at += 4
        elif kind == 108:  # 'l'
            value = _LONGLONG.unpack_from(buf, at)[0]
            at += 8
        elif kind == 116:  # 't'
            value = bool(buf[at])
            at += 1
        else:
            decoder = TABLE_MAPPING.get(bytes((kind,)))
            if decoder is None:
                raise _Unreadable(f"unknown field type {bytes((kind,))!r}")
            n, value = decoder(bytes(buf[at:end]))
            at += n
        out[key] = value
    if at != end:
        raise _Unreadable("field table overruns its length")
    return end, out


def _header(buf: bytearray, at: int, end: int) -> tuple[int, dict[str, Any], str]:
    """A content header's body size, headers and message id, from its
    payload ``buf[at:end]``."""
    _, _, size, flags = _HEADER_HEAD.unpack_from(buf, at)
    if flags & ~_FAST:
        raise _Unreadable("properties this reader does not read")
    at += 14
    headers: dict[str, Any] = {}
    message_id = ""
    if flags & _CONTENT_TYPE:
        at += 1 + buf[at]
    if flags & _ENCODING:
        at += 1 + buf[at]
    if flags & _HEADERS:
        at, headers = _table(buf, at)
    if flags & _MODE:
        at += 1
    if flags & _PRIORITY:
        at += 1
    if flags & _MESSAGE_ID:
        n = buf[at]
        message_id = buf[at + 1 : at + 1 + n].decode()
        at += 1 + n
    if at != end:
        raise _Unreadable("content header of an unexpected length")
    return size, headers, message_id


def _next(raw: bytearray, at: int, end: int, kind: int, number: int) -> int:
    """Where the frame at ``raw[at:]`` ends if it is a whole frame of type
    ``kind`` on channel ``number``; ``_INCOMPLETE`` if it is not all in
    yet, 0 if it is another frame."""
    if end - at < _HEAD_SIZE:
        return _INCOMPLETE
    got, channel, size = _HEAD.unpack_from(raw, at)
    stop = int(at + _HEAD_SIZE + size + 1)
    if got != kind or channel != number:
        return 0
    if stop > end:
        return _INCOMPLETE
    return stop if raw[stop - 1] == _END else 0


class Wire:
    """One connection's bytes: deliveries to the registered consumers, the
    rest to aiormq's reader (the module's doc)."""

    def __init__(self) -> None:
        #: whole frames for aiormq's reader, and the bytes not cut yet
        self.ready = bytearray()
        self.raw = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.paused = False
        #: the consumer channel (aiormq's) and its consumers taken here
        self.channel: Any = None
        self.consumers: dict[str, Consumer] = {}
        self.passed_at = time.monotonic()

    # -- aiormq's side: what its FrameReceiver reads (asyncio.StreamReader's)

    def at_eof(self) -> bool:
        return self.eof and not self.ready

    async def readexactly(self, n: int) -> bytes:
        ready = self.ready
        while len(ready) < n:
            if self.error is not None:
                raise self.error
            if self.eof:
                partial = bytes(ready)
                ready.clear()
                raise asyncio.IncompleteReadError(partial, n)
            await self._wait()
        data = bytes(ready[:n])
        del ready[:n]
        if self.paused and len(ready) < HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def read(self, n: int = -1) -> bytes:
        while not self.ready and not self.eof:
            if self.error is not None:
                raise self.error
            await self._wait()
        size = len(self.ready) if n < 0 else min(n, len(self.ready))
        data = bytes(self.ready[:size])
        del self.ready[:size]
        return data

    async def _wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- the socket's side

    def feed(self, data: bytes) -> None:
        raw = self.raw
        raw += data
        pos, end = 0, len(raw)
        ready = self.ready
        passed = False
        while end - pos >= _HEAD_SIZE:
            kind, number, size = _HEAD.unpack_from(raw, pos)
            stop = pos + _HEAD_SIZE + size + 1
            if stop > end:
                break
            if (
                kind == _METHOD
                and not ready
                and self.consumers
                and self.channel is not None
                and number == self.channel.number
                and _INDEX.unpack_from(raw, pos + _HEAD_SIZE)[0] == _DELIVER
                and self.channel.frames.empty()
                and not self.channel.is_closed
            ):
                try:
                    after = self._deliver(raw, pos, stop, end, number)
                except (_Unreadable, IndexError, ValueError, struct.error, UnicodeDecodeError):
                    after = 0  # aiormq reads it (and fails on it, if it must)
                if after == _INCOMPLETE:
                    break
                if after:
                    pos = after
                    continue
            ready += raw[pos:stop]
            passed = True
            pos = stop
        if pos:
            del raw[:pos]
        now = time.monotonic()
        if passed:
            self.passed_at = now
        elif pos and now - self.passed_at > KEEPALIVE:
            ready += HEARTBEAT
            self.passed_at = now
        if ready:
            self._wake()
            if len(ready) > HIGH_WATER and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()

    def _deliver(self, raw: bytearray, pos: int, stop: int, end: int, number: int) -> int:
        """Hand the delivery whose ``Basic.Deliver`` frame is ``raw[pos:stop]``
        to its consumer: where its last frame ends, ``_INCOMPLETE`` if its
        frames are not all in yet, 0 if it is not one to take here."""
        at = pos + _HEAD_SIZE + 4
        n = raw[at]
        consumer = self.consumers.get(raw[at + 1 : at + 1 + n].decode())
        if consumer is None or raw[stop - 1] != _END:
            return 0
        at += 1 + n
        tag = int(_TAG.unpack_from(raw, at)[0])
        redelivered = bool(raw[at + 8] & 1)
        hstop = _next(raw, stop, end, _HEADER, number)
        if hstop <= 0:
            return hstop
        size, headers, message_id = _header(raw, stop + _HEAD_SIZE, hstop - 1)
        parts: list[bytes] = []
        at, left = hstop, size
        while left > 0:
            bstop = _next(raw, at, end, _BODY, number)
            if bstop <= 0:
                return bstop
            parts.append(bytes(raw[at + _HEAD_SIZE : bstop - 1]))
            left -= bstop - at - _HEAD_SIZE - 1
            at = bstop
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        consumer(tag, redelivered, body, headers, message_id)
        return int(at)

    def lost(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.error = exc
        self.eof = True
        self._wake()


class _Protocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol (its flow control and close waiter serve
    aiormq's ``StreamWriter``), the bytes read going to ``Wire``."""

    def __init__(self, wire: Wire, loop: asyncio.AbstractEventLoop) -> None:
        self.stream = asyncio.StreamReader(loop=loop)
        super().__init__(self.stream, loop=loop)
        self.wire = wire

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # uvloop's transports are not ``asyncio.Transport`` subclasses
        self.wire.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.wire.feed(data)

    def eof_received(self) -> bool:
        self.wire.lost(None)
        return bool(super().eof_received())

    def connection_lost(self, exc: Exception | None) -> None:
        self.wire.lost(exc)
        super().connection_lost(exc)


class Factory(TransportFactory):
    """aiormq's transport factory for one connection: its socket read through
    ``wire``."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def create(self, url: Any, **kwargs: Any) -> tuple[Any, asyncio.StreamWriter]:
        provider = kwargs.pop("ssl_context_provider", None)
        ssl = await provider.get_context() if url.scheme == "amqps" and provider else None
        loop = asyncio.get_running_loop()
        protocol = _Protocol(self.wire, loop)
        try:
            transport, _ = await loop.create_connection(
                lambda: protocol, host=url.host, port=url.port, ssl=ssl, **kwargs
            )
        except OSError as e:
            from aiormq.exceptions import AMQPConnectionError

            raise AMQPConnectionError(*e.args) from e
        writer = asyncio.StreamWriter(transport, protocol, protocol.stream, loop)
        return self.wire, writer
