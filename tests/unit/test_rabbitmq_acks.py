"""A ``multiple`` ack settles every tag up to its own that the server
delivered on the channel: the link may send one only over a run of tags it
was handed and is settling, whatever order they reached it in
(``brokers/rabbitmq/tags.py``).  Otherwise a delivery handed over late (by
aiormq's task, after a later one the wire took) is settled on the server
before it ran, and its own ack closes the channel."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from dumbwaiter.brokers.rabbitmq.link import AmqpLink
from dumbwaiter.brokers.rabbitmq.tags import Unacked


class _Channel:
    """The consumer channel's calls the link makes, recorded."""

    is_closed = False

    def __init__(self) -> None:
        self.acks: list[tuple[int, bool]] = []

    async def basic_qos(self, **_: Any) -> None:
        return None

    async def basic_consume(self, *_: Any, **__: Any) -> Any:
        return SimpleNamespace(consumer_tag="ctag")

    async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:
        self.acks.append((tag, multiple))


async def _link() -> tuple[AmqpLink, Any, _Channel]:
    """A link with one consumer; its hand-over (what the wire calls)."""
    link = AmqpLink("amqp://guest:guest@127.0.0.1:5672/", "test", asyncio.get_running_loop())
    ch = _Channel()
    link.cons, link.gen = ch, 7  # type: ignore[assignment]
    link.wire = SimpleNamespace(consumers={})  # type: ignore[assignment]
    await link.consume("p.q.default", "default", "main", 10)
    take = link.wire.consumers["ctag"]  # type: ignore[union-attr]

    def hand(tag: int) -> None:
        take(tag, False, b"{}", {}, f"m{tag}")

    return link, hand, ch


async def test_a_later_tag_handed_first_is_acked_alone() -> None:
    link, hand, ch = await _link()
    hand(1)
    hand(3)
    hand(2)  # aiormq's task ran after the wire took 3
    await link.ack(7, [1, 3])
    assert ch.acks == [(1, True), (3, False)]  # never a multiple ack over 2
    await link.ack(7, [2])
    assert ch.acks[-1] == (2, True)
    assert not link.unacked


async def test_no_multiple_ack_covers_a_tag_not_handed_over_yet() -> None:
    link, hand, ch = await _link()
    hand(1)
    hand(2)
    hand(4)  # 3 is still on its way through aiormq
    await link.ack(7, [1, 2, 4])
    assert ch.acks == [(2, True), (4, False)]
    hand(3)
    await link.ack(7, [3])
    assert ch.acks[-1] == (3, True)


async def test_in_order_tags_are_settled_by_one_multiple_ack() -> None:
    link, hand, ch = await _link()
    for tag in range(1, 6):
        hand(tag)
    await link.ack(7, [2, 1, 3])
    await link.ack(7, [5])
    assert ch.acks == [(3, True), (5, False)]
    await link.ack(7, [4, 5])  # 5 is settled already: not acked twice
    assert ch.acks[-1] == (4, True) and len(ch.acks) == 3
    assert link.settled == 5


@pytest.mark.parametrize(
    ("handed", "settling", "upto", "alone"),
    [
        ([1, 2, 3], [1, 2, 3], 3, []),
        ([1, 2, 3], [1, 3], 1, [3]),
        ([2, 1], [2], 0, [2]),
        ([1, 3], [1, 3], 1, [3]),
        ([1, 3, 2], [1, 2, 3], 3, []),
        ([5], [5], 0, [5]),
    ],
)
def test_unacked_settles(
    handed: list[int], settling: list[int], upto: int, alone: list[int]
) -> None:
    u = Unacked()
    for tag in handed:
        u.add(tag)
    assert u.settle(settling)[:2] == (upto, alone)
