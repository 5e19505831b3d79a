"""Publishes that skip aiormq's writer task (``outgoing.start``) must keep a
channel's order: RabbitMQ numbers publishes as they arrive and confirms by
that number, so a frame that overtook another would have its confirm
answer for the other message.  A full queue that rejects what comes makes
that visible: publishes go, interleaved, to it (each nacked) or to a queue
with room (each acked), and every publish must get its own answer."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiormq
from pamqp import commands as spec

from dumbwaiter.brokers.rabbitmq import outgoing
from dumbwaiter.brokers.rabbitmq.link import _FACTORIES, _Recording
from tests.integration.rabbitmq import server


def _rejected(i: int) -> bool:
    """Whether publish ``i`` goes to the full queue (a mix without a period
    that lines up with the ways of publishing below)."""
    return (i * 7) % 11 < 5


async def test_direct_and_queued_publishes_are_confirmed_for_the_right_message() -> None:
    assert _FACTORIES, "this aiormq takes no transport_factory: nothing skips its writer"
    url = server.amqp_base()
    factory = _Recording(url)
    conn = await aiormq.connect(url, transport_factory=factory)
    name = f"dwtest-order-{uuid.uuid4().hex[:8]}"
    full, room = f"{name}-full", f"{name}-room"
    try:
        ch = await conn.channel(publisher_confirms=True)
        assert isinstance(ch, aiormq.Channel) and factory.writer is not None
        await ch.queue_declare(
            full, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        await ch.queue_declare(room, durable=True)
        await ch.basic_publish(b"", routing_key=full)  # from now on it rejects every publish
        direct = queued = 0

        async def one(i: int) -> tuple[int, bool]:
            nonlocal direct, queued
            for _ in range(i % 5):  # interleave: some turns of the loop first
                await asyncio.sleep(0)
            if i % 6 == 3:  # until the writer task has emptied its queue
                for _ in range(20):
                    if ch.write_queue.empty():
                        break
                    await asyncio.sleep(0)
            queue = full if _rejected(i) else room
            props = spec.Basic.Properties(message_id=f"m{i}", delivery_mode=2)
            body = str(i).encode()
            fut = None
            if i % 3 == 0:  # now, past the writer task's queue when it is empty
                empty = ch.write_queue.empty()
                fut = outgoing.start(ch, factory.writer, "", queue, body, props)
                if fut is not None:
                    direct, queued = direct + empty, queued + (not empty)
            try:
                if fut is not None:
                    r: Any = await outgoing.confirmed(ch, fut)
                elif i % 3 == 2:  # aiormq's own: its lock, its writer task's queue
                    r = await ch.basic_publish(
                        body, routing_key=queue, properties=props, wait=False
                    )
                else:  # ours through that queue
                    r = await outgoing.publish(ch, "", queue, body, props)
            except aiormq.exceptions.DeliveryError as exc:  # a nack
                r = exc.frame
            return i, isinstance(r, spec.Basic.Ack)

        results: list[tuple[int, bool]] = []
        for wave in range(0, 300, 6):  # fewer at once than aiormq's queue holds (10)
            results += await asyncio.gather(*(one(i) for i in range(wave, wave + 6)))
        assert [i for i, acked in results if acked == _rejected(i)] == []
        assert direct > 10 and queued > 10  # both ways were taken
    finally:
        ch2 = await conn.channel()
        await ch2.queue_delete(full)
        await ch2.queue_delete(room)
        await conn.close()
