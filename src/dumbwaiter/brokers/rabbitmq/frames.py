"""A cheaper frame reader for aiormq: whole reads, not three per frame.

aiormq's ``FrameReceiver.get_frame`` reads each AMQP frame with three
``readexactly`` calls (type, header, payload) into a ``BytesIO`` under an
``asyncio.Lock``; a consumed message is three frames (``Basic.Deliver``,
content header, body), so a worker draining small jobs spends most of its
reading in that machinery rather than in parsing (35-48 % of the worker's
GIL-held time went to aiormq's reading and parsing in W1's drain).  This
reader takes whatever the stream has buffered in one ``read``, cuts every
complete frame out of it and hands them out one by one; the frames are
still unmarshalled by pamqp, and the errors are aiormq's own, so the
connection behaves as before.

It is installed by replacing ``aiormq.connection.FrameReceiver``, the class
``Connection.connect`` builds its reader from (a module global it looks up
when it connects): every aiormq connection of the process gets it, which is
why it keeps aiormq's contract exactly (``get_frame``, ``__anext__``,
``started``, end of stream).  ``install`` does nothing on an aiormq whose
receiver does not look as expected.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Any

import aiormq.connection as _conn
import pamqp.constants
import pamqp.frame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.decode import TABLE_MAPPING
from pamqp.exceptions import PAMQPException
from pamqp.header import ContentHeader

_HEAD = struct.Struct(">BHI")
#: frame type, channel and size (7 bytes), then the payload and the end octet
_HEAD_SIZE = 7
#: what one read takes from the stream at most
READ_SIZE = 1 << 16

_CHANNEL = struct.Struct(">H")
_INDEX = struct.Struct(">I")
_TAG = struct.Struct(">Q")
_HEADER_HEAD = struct.Struct(">HHQH")
_LONG = struct.Struct(">I")
_INT = struct.Struct(">i")
_LONGLONG = struct.Struct(">q")
_METHOD, _BODY = pamqp.constants.FRAME_METHOD, pamqp.constants.FRAME_BODY
_HEADER = pamqp.constants.FRAME_HEADER
_P = spec.Basic.Properties
#: the properties a content header may carry for ``_header`` (the ones
#: dumbwaiter's copies and RabbitMQ's dead-lettering use); any other flag,
#: or a second flag word, goes to pamqp
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
_DEFAULTS = [(name, getattr(_P(), name)) for name in _P.__slots__]
_FAST = _CONTENT_TYPE | _ENCODING | _HEADERS | _MODE | _PRIORITY | _MESSAGE_ID
_END = pamqp.constants.FRAME_END
_DELIVER = spec.Basic.Deliver.index
_ACK = spec.Basic.Ack.index
#: its method index, the delivery tag and the bits octet
_ACK_SIZE = 13

_Original = _conn.FrameReceiver


def _deliver(buf: bytearray, at: int) -> spec.Basic.Deliver:
    """A ``Basic.Deliver`` from its arguments at ``buf[at:]``, as pamqp's
    generic unmarshal builds it (the same five attributes), without its
    decoding by type name of every field: two short strings, the tag, the
    redelivered bit, two more short strings (AMQP 0-9-1)."""
    d = spec.Basic.Deliver.__new__(spec.Basic.Deliver)
    n = buf[at]
    d.consumer_tag = buf[at + 1 : at + 1 + n].decode()
    at += 1 + n
    d.delivery_tag = _TAG.unpack_from(buf, at)[0]
    d.redelivered = bool(buf[at + 8] & 1)
    at += 9
    n = buf[at]
    d.exchange = buf[at + 1 : at + 1 + n].decode()
    at += 1 + n
    n = buf[at]
    d.routing_key = buf[at + 1 : at + 1 + n].decode()
    return d


def _table(buf: bytearray, at: int) -> tuple[int, dict[str, Any]]:
    """A field table at ``buf[at:]`` and where it ends, as pamqp's
    ``decode.field_table`` reads it: long strings, 8/32/64-bit integers and
    booleans here, any other type by pamqp's own decoder of that type."""
    end = at + 4 + _LONG.unpack_from(buf, at)[0]
    if end > len(buf):
        raise ValueError("Field table length exceeds available data")
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
                raise ValueError(f"Unknown type: {bytes((kind,))!r}")
            n, value = decoder(bytes(buf[at:end]))
            at += n
        out[key] = value
    if at != end:
        raise ValueError("Field table overruns its length")
    return end, out


def _header(buf: bytearray, at: int, end: int) -> ContentHeader | None:
    """A content header from its payload at ``buf[at:]``, as pamqp's
    unmarshal builds it (the same ``ContentHeader`` and ``Basic.Properties``
    attributes), for the properties of ``_FAST``; None for any other (pamqp
    reads it then)."""
    class_id, weight, size, flags = _HEADER_HEAD.unpack_from(buf, at)
    if flags & ~_FAST:
        return None
    at += 14
    p = _P.__new__(_P)
    for name, value in _DEFAULTS:  # as pamqp's __init__ sets them
        setattr(p, name, value)
    if flags & _CONTENT_TYPE:
        n = buf[at]
        p.content_type = buf[at + 1 : at + 1 + n].decode()
        at += 1 + n
    if flags & _ENCODING:
        n = buf[at]
        p.content_encoding = buf[at + 1 : at + 1 + n].decode()
        at += 1 + n
    if flags & _HEADERS:
        at, p.headers = _table(buf, at)
    if flags & _MODE:
        p.delivery_mode = buf[at]
        at += 1
    if flags & _PRIORITY:
        p.priority = buf[at]
        at += 1
    if flags & _MESSAGE_ID:
        n = buf[at]
        p.message_id = buf[at + 1 : at + 1 + n].decode()
        at += 1 + n
    if at != end:
        raise ValueError("content header of an unexpected length")
    h = ContentHeader.__new__(ContentHeader)
    h.class_id, h.weight, h.body_size, h.properties = class_id, weight, size, p
    return h


def _fast_header(buf: bytearray, at: int, end: int) -> ContentHeader | None:
    """``_header``, or None when it cannot read the frame (pamqp then reads
    it and raises its own error)."""
    try:
        return _header(buf, at, end)
    except (IndexError, ValueError, struct.error, UnicodeDecodeError):
        return None


def _ack(buf: bytearray, at: int) -> spec.Basic.Ack:
    """A publisher confirm's ``Basic.Ack`` (its delivery tag and the
    ``multiple`` bit), as pamqp's unmarshal builds it."""
    a = spec.Basic.Ack.__new__(spec.Basic.Ack)
    a.delivery_tag = _TAG.unpack_from(buf, at)[0]
    a.multiple = bool(buf[at + 8] & 1)
    return a


class FrameReceiver(_conn.FrameReceiver):
    """aiormq's frame receiver, reading the stream in whole chunks."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self._buf = bytearray()
        self._frames: deque[Any] = deque()

    async def get_frame(self) -> Any:  # aiormq's ReceivedFrame
        frames = self._frames
        if frames:
            return frames.popleft()
        async with self.lock:  # one reader of the stream at a time, as aiormq's
            if frames:  # another caller's read brought some meanwhile
                return frames.popleft()
            return await self._read()

    async def _read(self) -> Any:
        frames, buf = self._frames, self._buf
        if not buf and self.reader.at_eof():
            del self.reader
            raise StopAsyncIteration
        while True:
            try:
                chunk = await self.reader.read(READ_SIZE)
            except ConnectionRefusedError as e:
                raise AMQPConnectionError(f"Server connection refused: {e!r}") from e
            except ConnectionResetError as e:
                raise AMQPConnectionError(f"Server connection reset: {e!r}") from e
            except ConnectionError as e:
                raise AMQPConnectionError(f"Server connection error: {e!r}") from e
            except OSError as e:
                raise AMQPConnectionError(f"Server communication error: {e!r}") from e
            if not chunk:
                raise AMQPConnectionError(
                    "Server connection unexpectedly closed. "
                    f"Read {len(buf)} bytes of an unfinished frame"
                )
            buf += chunk
            self._cut(buf, frames)
            if frames:
                return frames.popleft()

    def _cut(self, buf: bytearray, frames: deque[Any]) -> None:
        """Move every complete frame at the head of ``buf`` into ``frames``."""
        pos, end = 0, len(buf)
        while end - pos >= _HEAD_SIZE:
            if not self.started:
                if buf.startswith(b"AMQP"):
                    raise ProtocolSyntaxError("Unexpected AMQP protocol header")
                self.started = True
            size = _HEAD.unpack_from(buf, pos)[2]
            stop = pos + _HEAD_SIZE + size + 1
            if stop > end:
                break
            kind, channel = buf[pos], _CHANNEL.unpack_from(buf, pos + 1)[0]
            if kind == _BODY and buf[stop - 1] == _END:
                frame: Any = ContentBody(bytes(buf[pos + _HEAD_SIZE : stop - 1]))
                frames.append((stop - pos, channel, frame))
            elif (
                kind == _HEADER
                and buf[stop - 1] == _END
                and (header := _fast_header(buf, pos + _HEAD_SIZE, stop - 1))
            ):
                frames.append((stop - pos, channel, header))
            elif (
                kind == _METHOD
                and buf[stop - 1] == _END
                and _INDEX.unpack_from(buf, pos + _HEAD_SIZE)[0] == _DELIVER
            ):
                frames.append((stop - pos, channel, _deliver(buf, pos + _HEAD_SIZE + 4)))
            elif (
                kind == _METHOD
                and size == _ACK_SIZE
                and buf[stop - 1] == _END
                and _INDEX.unpack_from(buf, pos + _HEAD_SIZE)[0] == _ACK
            ):
                frames.append((stop - pos, channel, _ack(buf, pos + _HEAD_SIZE + 4)))
            else:
                try:
                    frames.append(pamqp.frame.unmarshal(bytes(buf[pos:stop])))
                except PAMQPException as e:
                    raise InvalidFrameError(str(e)) from e
            pos = stop
        if pos:
            del buf[:pos]


def _looks_right() -> bool:
    """Whether aiormq's receiver is the one this reader was written against:
    built from a stream reader, with ``reader``, ``started`` and ``get_frame``."""
    init = getattr(_Original, "__init__", None)
    code = getattr(init, "__code__", None)
    return (
        code is not None
        and code.co_varnames[:2] == ("self", "reader")
        and {"reader", "started"} <= set(code.co_names)
        and callable(getattr(_Original, "get_frame", None))
    )


def install() -> bool:
    """Make aiormq's connections read with ``FrameReceiver`` (once)."""
    if _conn.FrameReceiver is FrameReceiver:
        return True
    if not _looks_right():
        return False
    _conn.FrameReceiver = FrameReceiver  # type: ignore[misc]
    return True
