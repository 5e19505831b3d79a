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
from pamqp.exceptions import PAMQPException

_HEAD = struct.Struct(">BHI")
#: frame type, channel and size (7 bytes), then the payload and the end octet
_HEAD_SIZE = 7
#: what one read takes from the stream at most
READ_SIZE = 1 << 16

_CHANNEL = struct.Struct(">H")
_INDEX = struct.Struct(">I")
_TAG = struct.Struct(">Q")
_METHOD, _BODY = pamqp.constants.FRAME_METHOD, pamqp.constants.FRAME_BODY
_END = pamqp.constants.FRAME_END
_DELIVER = spec.Basic.Deliver.index

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
                kind == _METHOD
                and buf[stop - 1] == _END
                and _INDEX.unpack_from(buf, pos + _HEAD_SIZE)[0] == _DELIVER
            ):
                frames.append((stop - pos, channel, _deliver(buf, pos + _HEAD_SIZE + 4)))
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
