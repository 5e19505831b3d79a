"""The RabbitMQ broker's frame reader (brokers/rabbitmq/frames.py): the
frames aiormq's own reader would return, from any split of the stream, and
aiormq's errors at its end."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq.connection
import pamqp.frame
import pytest
from aiormq.exceptions import AMQPConnectionError, ProtocolSyntaxError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from dumbwaiter.brokers.rabbitmq import frames, link


def _delivery(tag: int, body: bytes) -> bytes:
    props = spec.Basic.Properties(message_id=f"m{tag}", headers={"dw-v": tag})
    return b"".join(
        [
            pamqp.frame.marshal(spec.Basic.Deliver("ctag", tag, False, "", "q"), 2),
            pamqp.frame.marshal(ContentHeader(0, len(body), props), 2),
            pamqp.frame.marshal(ContentBody(body), 2),
        ]
    )


async def _read_all(data: bytes, cut: int) -> list[Any]:
    """Feed ``data`` in pieces of ``cut`` bytes while the receiver reads."""
    reader = asyncio.StreamReader()
    rx = frames.FrameReceiver(reader)

    async def feed() -> None:
        for i in range(0, len(data), cut):
            reader.feed_data(data[i : i + cut])
            await asyncio.sleep(0)
        reader.feed_eof()

    feeding = asyncio.ensure_future(feed())
    got = []
    with pytest.raises(AMQPConnectionError):  # the stream ends while it waits
        while True:
            got.append(await rx.get_frame())
    await feeding
    return got


@pytest.mark.parametrize("cut", [1, 5, 7, 64, 1 << 20])
async def test_frames_come_out_whole_and_in_order_from_any_split(cut: int) -> None:
    data = b"".join(_delivery(t, b"x" * (t * 37)) for t in range(1, 6))
    got = await _read_all(data, cut)
    assert [ch for _, ch, _ in got] == [2] * 15
    kinds = [type(f) for _, _, f in got]
    assert kinds == [spec.Basic.Deliver, ContentHeader, ContentBody] * 5
    for n, (_, _, f) in enumerate(got[0::3], 1):
        assert f.delivery_tag == n
    for n, (_, _, f) in enumerate(got[1::3], 1):
        assert f.properties.headers == {"dw-v": n} and f.body_size == n * 37
    assert [f.value for _, _, f in got[2::3]] == [b"x" * (t * 37) for t in range(1, 6)]
    # what aiormq's own reader makes of the same bytes
    assert [n for n, _, _ in got] == [pamqp.frame.unmarshal(data[i:])[0] for i in _offsets(data)]


def _offsets(data: bytes) -> list[int]:
    out, i = [], 0
    while i < len(data):
        out.append(i)
        i += pamqp.frame.unmarshal(data[i:])[0]
    return out


async def test_a_stream_that_ended_stops_the_iteration() -> None:
    reader = asyncio.StreamReader()
    reader.feed_eof()
    with pytest.raises(StopAsyncIteration):
        await frames.FrameReceiver(reader).get_frame()


async def test_a_protocol_header_from_the_server_is_refused() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"AMQP\x00\x00\x09\x01")
    with pytest.raises(ProtocolSyntaxError):
        await frames.FrameReceiver(reader).get_frame()


def test_aiormq_connections_read_with_it() -> None:
    assert link.FAST_FRAMES
    assert aiormq.connection.FrameReceiver is frames.FrameReceiver


@pytest.mark.parametrize("redelivered", [False, True])
async def test_deliveries_and_bodies_equal_pamqps_own(redelivered: bool) -> None:
    """The fast paths (``Basic.Deliver``, body frames) build what pamqp's
    generic unmarshal builds, with non-ASCII names and a redelivery."""
    data = pamqp.frame.marshal(
        spec.Basic.Deliver("ctag-é", 2**40 + 3, redelivered, "dw.x", "dw.q.ünï"), 5
    ) + pamqp.frame.marshal(ContentBody(b"\x00\xce" * 50), 5)
    got = await _read_all(data, 3)
    want = [pamqp.frame.unmarshal(data[i:]) for i in _offsets(data)]
    assert [(n, ch, type(f)) for n, ch, f in got] == [(n, ch, type(f)) for n, ch, f in want]
    (_, _, d), (_, _, w) = got[0], want[0]
    for attr in ("consumer_tag", "delivery_tag", "redelivered", "exchange", "routing_key"):
        assert getattr(d, attr) == getattr(w, attr)
    body = want[1][2]
    assert isinstance(body, ContentBody)
    assert got[1][2].value == body.value


async def test_callers_at_once_share_the_frames_in_order() -> None:
    """Two tasks waiting on one receiver (aiormq has one reader, but its
    receiver allowed more) each get whole frames, in the stream's order."""
    data = b"".join(_delivery(t, b"y" * 20) for t in range(1, 4))
    reader = asyncio.StreamReader()
    rx = frames.FrameReceiver(reader)
    waiting = [asyncio.ensure_future(rx.get_frame()) for _ in range(9)]
    await asyncio.sleep(0)
    reader.feed_data(data)
    got = await asyncio.gather(*waiting)
    want = [pamqp.frame.unmarshal(data[i:]) for i in _offsets(data)]
    assert [type(f) for _, _, f in got] == [type(f) for _, _, f in want]
    assert [f.delivery_tag for _, _, f in got[0::3]] == [1, 2, 3]


_PROPS = [
    spec.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        message_id="ïd-1",
        headers={"dw-v": 3, "dw-e": "a1b2", "dw-seen": "1764612345.123456"},
    ),
    spec.Basic.Properties(  # RabbitMQ's dead-lettering: x-death, arrays, timestamps
        content_type="application/json",
        delivery_mode=2,
        priority=7,
        message_id="m",
        headers={
            "dw-v": 2**40,
            "neg": -5,
            "big": -(2**33),
            "ok": True,
            "x-death": [{"count": 1, "queue": "q", "reason": "expired", "f": 1.5}],
        },
    ),
    spec.Basic.Properties(message_id="m", headers={}),
    spec.Basic.Properties(),
    # flags the fast path leaves to pamqp
    spec.Basic.Properties(correlation_id="c", reply_to="r", expiration="100", app_id="a"),
]


@pytest.mark.parametrize("props", _PROPS)
async def test_content_headers_equal_pamqps_own(props: spec.Basic.Properties) -> None:
    """The content header's fast path builds the ``ContentHeader`` and
    ``Basic.Properties`` pamqp's unmarshal builds (every attribute)."""
    data = pamqp.frame.marshal(ContentHeader(0, 12345, props), 4)
    [(n, ch, got)] = await _read_all(data, 1 << 20)
    wn, wch, want = pamqp.frame.unmarshal(data)
    assert (n, ch, type(got)) == (wn, wch, type(want))
    assert isinstance(want, ContentHeader)
    assert (got.class_id, got.weight, got.body_size) == (want.class_id, want.weight, 12345)
    for name in spec.Basic.Properties.__slots__:
        assert getattr(got.properties, name) == getattr(want.properties, name), name


async def test_a_malformed_content_header_is_pamqps_to_refuse() -> None:
    data = bytearray(pamqp.frame.marshal(ContentHeader(0, 1, _PROPS[0]), 4))
    data[7 + 14 + 1 + 16 + 3] = 0xFF  # the header table's length, past the frame
    assert frames._fast_header(data, 7, len(data) - 1) is None


@pytest.mark.parametrize("multiple", [False, True])
async def test_publisher_confirms_equal_pamqps_own(multiple: bool) -> None:
    data = pamqp.frame.marshal(spec.Basic.Ack(2**40 + 7, multiple), 1) + pamqp.frame.marshal(
        spec.Basic.Nack(9, multiple, True), 1
    )
    got = await _read_all(data, 5)
    want = [pamqp.frame.unmarshal(data[i:]) for i in _offsets(data)]
    assert [(n, ch, type(f)) for n, ch, f in got] == [(n, ch, type(f)) for n, ch, f in want]
    for (_, _, g), (_, _, w) in zip(got, want, strict=True):
        assert isinstance(w, spec.Basic.Ack | spec.Basic.Nack)
        assert (g.delivery_tag, g.multiple) == (w.delivery_tag, w.multiple)
