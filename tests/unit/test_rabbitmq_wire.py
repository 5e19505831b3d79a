"""The connection's reader hands a delivery to the link's consumer itself only
when nothing is ahead of it (no bytes waiting for aiormq's reader, the
consumer channel's queue empty) and only for a consumer the link registered;
every other frame reaches aiormq's reader byte for byte, in the order it
came (``wire.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pamqp.frame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from dumbwaiter.brokers.rabbitmq import wire


class _Channel:
    number = 1
    is_closed = False

    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()


def _wire() -> tuple[wire.Wire, list[tuple[Any, ...]]]:
    got: list[tuple[Any, ...]] = []
    w = wire.Wire()
    w.channel = _Channel()
    w.consumers["ours"] = lambda *args: got.append(args)
    return w, got


def _delivery(tag: int, body: bytes, consumer: str = "ours", cut: int = 0, **props: Any) -> bytes:
    props.setdefault("headers", {"dw-v": 3, "dw-e": "tok", "big": 1 << 40, "t": True})
    props.setdefault("message_id", f"m{tag}")
    frames: list[Any] = [
        spec.Basic.Deliver(consumer_tag=consumer, delivery_tag=tag, routing_key="q"),
        ContentHeader(body_size=len(body), properties=spec.Basic.Properties(**props)),
    ]
    step = cut or len(body) or 1
    frames += [ContentBody(body[i : i + step]) for i in range(0, len(body), step)]
    return b"".join(pamqp.frame.marshal(f, 1) for f in frames)


def test_deliveries_reach_the_consumer_whole_with_their_headers() -> None:
    w, got = _wire()
    data = _delivery(1, b"abc") + _delivery(2, b"") + _delivery(3, b"0123456789", cut=3)
    w.feed(data)
    assert [(tag, body) for tag, _, body, _, _ in got] == [
        (1, b"abc"),
        (2, b""),
        (3, b"0123456789"),
    ]
    assert got[0][3] == {"dw-v": 3, "dw-e": "tok", "big": 1 << 40, "t": True}
    assert got[0][4] == "m1" and got[0][1] is False
    assert not w.ready and not w.raw


def test_a_delivery_cut_anywhere_between_reads_arrives_once() -> None:
    data = _delivery(7, b"x" * 50, cut=20)
    for at in range(1, len(data)):
        w, got = _wire()
        w.feed(data[:at])
        w.feed(data[at:])
        assert [(tag, body) for tag, _, body, _, _ in got] == [(7, b"x" * 50)], at
        assert not w.ready


def test_a_delivery_behind_a_frame_for_aiormq_waits_its_turn() -> None:
    w, got = _wire()
    empty = pamqp.frame.marshal(spec.Basic.GetEmpty(), 1)
    later = _delivery(1, b"abc")
    w.feed(empty + later)
    assert got == [] and bytes(w.ready) == empty + later
    w.ready.clear()  # aiormq's reader took them
    w.channel.frames.put_nowait((1, spec.Basic.GetEmpty()))  # its channel has not
    w.feed(_delivery(2, b"x"))
    assert got == []
    w.ready.clear()
    w.channel.frames.get_nowait()
    w.feed(_delivery(3, b"y"))
    assert [tag for tag, *_ in got] == [3]


def test_other_consumers_channels_and_properties_go_to_aiormq() -> None:
    w, got = _wire()
    theirs = _delivery(1, b"a", consumer="theirs")
    w.feed(theirs)
    assert got == [] and bytes(w.ready) == theirs
    w.ready.clear()
    odd = _delivery(2, b"b", correlation_id="c")  # a property the wire does not read
    w.feed(odd)
    assert got == [] and bytes(w.ready) == odd
    w.ready.clear()
    other = b"".join(
        pamqp.frame.marshal(f, 2)
        for f in (
            spec.Basic.Deliver(consumer_tag="ours", delivery_tag=3, routing_key="q"),
            ContentHeader(body_size=1),
            ContentBody(b"c"),
        )
    )
    w.feed(other)
    assert got == [] and bytes(w.ready) == other


async def test_aiormq_reads_what_is_passed_and_a_heartbeat_while_deliveries_are_taken() -> None:
    w, got = _wire()
    ok = pamqp.frame.marshal(spec.Basic.QosOk(), 1)
    reading = asyncio.ensure_future(w.readexactly(len(ok)))
    waiting: list[bool] = []

    def feed() -> None:
        # the loop runs its callbacks in order: the read's first step (it
        # waits for bytes) comes before this one
        waiting.append(w.waiter is not None)
        w.feed(ok)

    asyncio.get_running_loop().call_soon(feed)
    assert await reading == ok
    assert waiting == [True]  # the bytes woke a read that was waiting for them
    w.passed_at -= wire.KEEPALIVE + 1
    w.feed(_delivery(1, b"a"))
    assert len(got) == 1 and bytes(w.ready) == wire.HEARTBEAT
    assert pamqp.frame.unmarshal(bytes(w.ready))[2].name == "Heartbeat"
    w.ready.clear()
    w.lost(None)
    assert w.at_eof()
