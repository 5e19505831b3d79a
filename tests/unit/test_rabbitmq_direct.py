"""The consumer channel's frame queue hands a delivery to the link's consumer
itself only when nothing is queued before it, and only for a consumer the
link marked; everything else reaches aiormq's channel reader in the order it
came (``direct.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from dumbwaiter.brokers.rabbitmq import direct


class _Channel:
    def __init__(self) -> None:
        self.frames: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.consumers: dict[str, Any] = {}
        self.got: list[tuple[int, bytes]] = []

        def on_message(m: Any) -> None:
            self.got.append((int(m.delivery.delivery_tag), m.body))

        self.consumers["ours"] = direct.mark(on_message)
        self.consumers["theirs"] = lambda m: self.got.append((-1, m.body))
        assert direct.install(self)


def _delivery(tag: int, body: bytes, consumer: str = "ours", cut: int = 0) -> list[Any]:
    frames: list[Any] = [
        spec.Basic.Deliver(consumer_tag=consumer, delivery_tag=tag, routing_key="q"),
        ContentHeader(body_size=len(body)),
    ]
    step = cut or len(body) or 1
    frames += [ContentBody(body[i : i + step]) for i in range(0, len(body), step)]
    return frames


def _put(ch: _Channel, frames: list[Any]) -> None:
    for f in frames:
        ch.frames.put_nowait((1, f))


def _queued(ch: _Channel) -> list[Any]:
    out = []
    while not ch.frames.empty():
        out.append(ch.frames.get_nowait()[1])
    return out


def test_a_delivery_with_nothing_queued_reaches_the_consumer_whole() -> None:
    ch = _Channel()
    _put(ch, _delivery(1, b"abc"))
    _put(ch, _delivery(2, b""))  # no body frame at all
    _put(ch, _delivery(3, b"0123456789", cut=3))  # four body frames
    assert ch.got == [(1, b"abc"), (2, b""), (3, b"0123456789")]
    assert ch.frames.empty()


def test_a_delivery_behind_a_queued_frame_waits_its_turn() -> None:
    ch = _Channel()
    empty = spec.Basic.GetEmpty()
    ch.frames.put_nowait((1, empty))  # the channel's reader has not taken it yet
    frames = _delivery(1, b"abc")
    _put(ch, frames)
    assert ch.got == []
    assert _queued(ch) == [empty, *frames]
    _put(ch, _delivery(2, b"x"))  # the queue was emptied: straight to the consumer
    assert ch.got == [(2, b"x")]


def test_an_unmarked_consumer_and_other_frames_go_through_the_queue() -> None:
    ch = _Channel()
    theirs = _delivery(1, b"abc", consumer="theirs")
    _put(ch, theirs)
    assert ch.got == [] and _queued(ch) == theirs
    cancel = spec.Basic.CancelOk(consumer_tag="ours")
    ch.frames.put_nowait((1, cancel))
    assert _queued(ch) == [cancel]


def test_frames_out_of_the_protocol_order_are_all_queued_in_order() -> None:
    ch = _Channel()
    deliver, header, body = _delivery(1, b"abc")
    odd = spec.Basic.GetEmpty()
    _put(ch, [deliver, odd])  # a header was due
    assert _queued(ch) == [deliver, odd]
    _put(ch, [deliver, header, odd])  # a body was due
    assert _queued(ch) == [deliver, header, odd]
    assert ch.got == []
    _put(ch, [deliver, header, body])  # and the next one is handed again
    assert ch.got == [(1, b"abc")]


def test_a_consumer_that_fails_loses_neither_the_queue_nor_the_next_delivery() -> None:
    ch = _Channel()
    calls: list[int] = []

    def failing(m: Any) -> None:
        calls.append(int(m.delivery.delivery_tag))
        raise RuntimeError("boom")

    ch.consumers["ours"] = direct.mark(failing)
    _put(ch, _delivery(1, b"a"))
    _put(ch, _delivery(2, b"b"))
    assert calls == [1, 2] and ch.frames.empty()


def test_a_channel_that_is_not_aiormqs_is_left_alone() -> None:
    class Other:
        frames: list[Any] = []
        consumers: dict[str, Any] = {}

    assert not direct.install(Other())
