"""The ``publish`` hook: a cheaper confirmed publish on our own aiormq channel.

aiormq's ``Channel.basic_publish`` builds a ``Basic.Publish``, a
``ContentHeader`` and body frames, and pamqp marshals each by walking its
fields by type name, a large share of a one-at-a-time enqueue's event-loop
CPU (docs/benchmarks.md, "Private hooks").  dumbwaiter's copies carry few
properties (content type, delivery mode, message id, a small table of
strings and integers), so ``frames`` writes those bytes directly, and
``publish`` hands them to the channel with aiormq's own bookkeeping (its
lock, delivery tag, pending confirmation, message-id index and its rollback
when the frames never left), then waits for the confirm as
``basic_publish(wait=False)`` does.  Anything else (another property, a
value of another type, a name too long, a channel without confirms, an
aiormq whose channel looks different) goes through ``basic_publish`` as
before, so the errors stay aiormq's.

It reads and writes that bookkeeping on a channel the link opened, never on
aiormq's classes: other aiormq or aio-pika connections of the process are
untouched.  The link uses it only while the hook is on
(``DUMBWAITER_HOOKS_OFF``, brokers/hooks.py); off, every publish is
``basic_publish``.
"""

from __future__ import annotations

import asyncio
import operator
import struct
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.constants import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD

_P = spec.Basic.Properties
_CONTENT_TYPE, _HEADERS = _P.flags["content_type"], _P.flags["headers"]
_MODE, _MESSAGE_ID = _P.flags["delivery_mode"], _P.flags["message_id"]
#: the properties ``frames`` writes; a copy with any other is aiormq's
_OWN = {"content_type", "delivery_mode", "message_id", "headers"}
_OTHERS = [name for name in _P.__slots__ if name not in _OWN]
_DEFAULTS = {name: getattr(_P(), name) for name in _OTHERS}
_FRAME = struct.Struct(">BHI")
_PUBLISH = struct.Struct(">IH")  # class and method, reserved ticket
_HEADER = struct.Struct(">HHQH")  # class, weight, body size, property flags
_LONG = struct.Struct(">I")
#: pamqp's ``encode.table_integer``: the smallest type that holds the value
_INTEGERS = [
    (-128, 127, b"b", struct.Struct(">b")),
    (-32768, 32767, b"s", struct.Struct(">h")),
    (0, 65535, b"u", struct.Struct(">H")),
    (-(2**31), 2**31 - 1, b"I", struct.Struct(">i")),
    (0, 2**32 - 1, b"i", struct.Struct(">I")),
    (-(2**63), 2**63 - 1, b"l", struct.Struct(">q")),
]
_END = bytes((FRAME_END,))


class Unfit(Exception):
    """A publish ``frames`` does not write: aiormq's ``basic_publish`` does."""


#: the other properties as one tuple (one C call reads them all), and theirs
#: when unset: a copy whose tuple differs is aiormq's to write
_others = operator.attrgetter(*_OTHERS)
_UNSET = tuple(_DEFAULTS[name] for name in _OTHERS)
#: encodings kept between publishes, each dropped whole past ``_KEEP``
#: entries: a name's short string (header keys, content types), and a
#: whole ``Basic.Publish`` frame by channel, exchange and routing key (a
#: lane's is the same on every enqueue to it; the delay cascade's keys vary)
_KEEP = 512
_shorts: dict[str, bytes] = {}
_methods: dict[tuple[int, str, str], bytes] = {}


def _short(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise Unfit("a short string longer than 255 bytes")
    return bytes((len(raw),)) + raw


def _name(value: str) -> bytes:
    """``_short`` of a name that recurs (kept in ``_shorts``)."""
    raw = _shorts.get(value)
    if raw is None:
        raw = _short(value)
        if len(_shorts) >= _KEEP:
            _shorts.clear()
        _shorts[value] = raw
    return raw


def _method(channel: int, exchange: str, routing_key: str) -> bytes:
    """The ``Basic.Publish`` frame, frame header and end included."""
    key = (channel, exchange, routing_key)
    raw = _methods.get(key)
    if raw is None:
        method = (
            _PUBLISH.pack(spec.Basic.Publish.index, 0)
            + _short(exchange)
            + _short(routing_key)
            + b"\x00"  # mandatory, immediate: off
        )
        raw = _FRAME.pack(FRAME_METHOD, channel, len(method)) + method + _END
        if len(_methods) >= _KEEP:
            _methods.clear()
        _methods[key] = raw
    return raw


def _table(table: dict[str, Any]) -> bytes:
    """A field table as pamqp's ``encode.field_table`` writes it, for
    strings and integers (the smallest integer type that holds the value)."""
    parts: list[bytes] = []
    for key, value in sorted(table.items()):  # pamqp writes the keys sorted
        parts.append(_name(key))
        if type(value) is str:
            raw = value.encode()
            parts += (b"S", _LONG.pack(len(raw)), raw)
        elif type(value) is int:
            for low, high, kind, fmt in _INTEGERS:
                if low <= value <= high:
                    parts += (kind, fmt.pack(value))
                    break
            else:
                raise Unfit("an integer wider than 64 bits")
        else:
            raise Unfit(f"a header value of type {type(value).__name__}")
    raw = b"".join(parts)
    return _LONG.pack(len(raw)) + raw


def frames(
    channel: int, max_body: int, exchange: str, routing_key: str, body: bytes, props: _P
) -> bytes:
    """``Basic.Publish``, its content header and body frames, as the bytes
    aiormq's ``ChannelFrame.marshall`` of pamqp's frames would be."""
    if _others(props) != _UNSET:
        for name in _OTHERS:  # which one, for the reason
            if getattr(props, name, None) != _DEFAULTS[name]:
                raise Unfit(f"the property {name}")
    flags, fields = 0, []
    if props.content_type is not None:
        flags |= _CONTENT_TYPE
        fields.append(_name(props.content_type))
    if props.headers is not None:
        flags |= _HEADERS
        fields.append(_table(props.headers))
    if props.delivery_mode is not None:
        flags |= _MODE
        fields.append(bytes((props.delivery_mode,)))
    if props.message_id is not None:
        flags |= _MESSAGE_ID
        fields.append(_short(props.message_id))
    header = _HEADER.pack(spec.Basic.frame_id, 0, len(body), flags) + b"".join(fields)
    out = [
        _method(channel, exchange, routing_key),
        _FRAME.pack(FRAME_HEADER, channel, len(header)),
        header,
        _END,
    ]
    if len(body) <= max_body:
        if body:
            out += (_FRAME.pack(FRAME_BODY, channel, len(body)), body, _END)
    else:
        for start in range(0, len(body), max_body):
            chunk = body[start : start + max_body]
            out += (_FRAME.pack(FRAME_BODY, channel, len(chunk)), chunk, _END)
    return b"".join(out)


#: what ``publish`` uses of an aiormq channel
_USED = (
    "lock",
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "create_future",
    "max_content_size",
    "number",
    "_raise_on_channel_close",
)
#: ``_looks_right`` by channel class: what a channel has is its aiormq
#: version's, the same for every channel of that class
_checked: dict[type, bool] = {}


def _looks_right(ch: Any) -> bool:
    """Whether ``ch`` has what ``publish`` uses (looked at once a class)."""
    fits = _checked.get(type(ch))
    if fits is None:
        fits = _checked[type(ch)] = all(hasattr(ch, name) for name in _USED)
    return fits


async def publish(
    ch: aiormq.Channel, exchange: str, routing_key: str, body: bytes, props: _P
) -> Any:
    """A confirmed publish, as ``ch.basic_publish(..., wait=False)``: the
    confirmation frame RabbitMQ answered with (``Basic.Ack`` or ``Basic.Nack``)."""
    confirmation = await start(ch, exchange, routing_key, body, props)
    if confirmation is None:
        return await ch.basic_publish(
            body, exchange=exchange, routing_key=routing_key, properties=props, wait=False
        )
    return await confirmed(ch, confirmation)


async def start(
    ch: aiormq.Channel, exchange: str, routing_key: str, body: bytes, props: _P
) -> asyncio.Future[Any] | None:
    """The first half of ``publish``: the frames queued for aiormq's writer
    task, the pending confirmation returned (await it with ``confirmed``);
    None when ``frames`` does not write this publish (the caller uses
    ``basic_publish``).  It does not give up the event loop unless another
    publish holds the channel's lock, so a caller that yields once next
    lets the writer put the frames on the socket before it goes on."""
    try:
        if not ch.publisher_confirms or not props.message_id or not _looks_right(ch):
            raise Unfit("not a confirmed publish with a message id")
        payload = frames(ch.number, ch.max_content_size, exchange, routing_key, body, props)
    except Unfit:
        return None
    message_id = props.message_id
    async with ch._raise_on_channel_close():
        async with ch.lock:
            ch.delivery_tag += 1
            tag = ch.delivery_tag
            confirmation: asyncio.Future[Any] = ch.create_future()
            ch.confirmations[tag] = confirmation
            ch.message_id_delivery_tag[message_id] = tag
            try:
                await ch.write_queue.put(ChannelFrame(payload=payload, should_close=False))
            except BaseException:
                # RabbitMQ has not seen it: its sequence number is reused (aiormq's rollback)
                ch.delivery_tag -= 1
                ch.confirmations.pop(tag, None)
                if ch.message_id_delivery_tag.get(message_id) == tag:
                    ch.message_id_delivery_tag.pop(message_id)
                confirmation.cancel()
                raise

            confirmation.add_done_callback(_forgetter(ch, message_id, tag))
    return confirmation


async def confirmed(ch: aiormq.Channel, confirmation: asyncio.Future[Any]) -> Any:
    """The confirmation frame of a ``start``ed publish, the channel's close
    raised as aiormq's ``basic_publish`` raises it."""
    async with ch._raise_on_channel_close():
        return await confirmation


async def publish_many(
    ch: aiormq.Channel, items: list[tuple[str, str, bytes, _P]]
) -> list[Any] | None:
    """Several confirmed publishes in one write, under one hold of the
    channel's lock: their confirmation frames (an exception for one whose
    confirmation failed), in order; None when one of them is not ``frames``'
    to write (the caller publishes them one by one through aiormq then)."""
    try:
        if not ch.publisher_confirms or not _looks_right(ch):
            raise Unfit("not a confirmed channel")
        payloads = []
        for ex, rk, body, props in items:
            if not props.message_id:
                raise Unfit("no message id")
            payloads.append(frames(ch.number, ch.max_content_size, ex, rk, body, props))
    except Unfit:
        return None
    confirmations: list[asyncio.Future[Any]] = []
    async with ch._raise_on_channel_close():
        async with ch.lock:
            first = ch.delivery_tag + 1
            ids: list[tuple[str, int]] = []
            for _, _, _, props in items:
                ch.delivery_tag += 1
                confirmation = ch.create_future()
                ch.confirmations[ch.delivery_tag] = confirmation
                message_id = str(props.message_id)
                ch.message_id_delivery_tag[message_id] = ch.delivery_tag
                confirmations.append(confirmation)
                ids.append((message_id, ch.delivery_tag))
            try:
                await ch.write_queue.put(
                    ChannelFrame(payload=b"".join(payloads), should_close=False)
                )
            except BaseException:
                ch.delivery_tag = first - 1
                for (message_id, tag), confirmation in zip(ids, confirmations, strict=True):
                    ch.confirmations.pop(tag, None)
                    if ch.message_id_delivery_tag.get(message_id) == tag:
                        ch.message_id_delivery_tag.pop(message_id)
                    confirmation.cancel()
                raise
            for (message_id, tag), confirmation in zip(ids, confirmations, strict=True):
                confirmation.add_done_callback(_forgetter(ch, message_id, tag))
        return await asyncio.gather(*confirmations, return_exceptions=True)


def _forgetter(ch: aiormq.Channel, message_id: str, tag: int) -> Any:
    def forget(_: Any) -> None:
        if ch.message_id_delivery_tag.get(message_id) == tag:
            ch.message_id_delivery_tag.pop(message_id)

    return forget
