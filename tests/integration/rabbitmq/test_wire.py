"""Deliveries a link's consumer takes straight off the socket (``wire.py``)
arrive whole and once, bodies of every size (none, one frame, several
frames), after ``basic.get`` replies on the same channel (which aiormq reads)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiormq
import pytest
from pamqp import commands as spec

from dumbwaiter.brokers.rabbitmq import wire
from dumbwaiter.brokers.rabbitmq.link import AmqpLink
from tests.integration.rabbitmq import server


async def test_consumed_bodies_of_every_size_arrive_whole_and_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[int] = []  # the bytes of each delivery the wire took
    deliver = wire.Wire._deliver

    def counting(self: Any, raw: bytearray, pos: int, stop: int, end: int, number: int) -> int:
        after = deliver(self, raw, pos, stop, end, number)
        if after > 0:
            handed.append(after - pos)
        return after

    monkeypatch.setattr(wire.Wire, "_deliver", counting)
    url = server.amqp_base()
    link = AmqpLink(url, "dumbwaiter wire-test", asyncio.get_running_loop())
    name = f"dwtest-wire-{uuid.uuid4().hex[:8]}"
    conn = await aiormq.connect(url)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(name, durable=True)
        await link.ensure()
        assert link.conn is not None
        frame_max = int(link.conn.connection_tune.frame_max)
        sizes = [0, 1, 300, frame_max - 8, frame_max, 3 * frame_max + 17, 5]
        bodies = {f"m{i}": bytes([i % 251]) * size for i, size in enumerate(sizes * 6)}
        for mid, body in bodies.items():
            props = spec.Basic.Properties(message_id=mid, delivery_mode=2)
            await ch.basic_publish(body, routing_key=name, properties=props)
        got: dict[str, bytes] = {}
        # half by get (its replies come through the channel's queue), then
        # a consumer takes the rest
        for _ in range(len(bodies) // 2):
            raw = await link.get(name, "q", "main")
            assert raw is not None
            got[raw.message_id] = raw.body
        await link.consume(name, "q", "main", prefetch=8)
        while len(got) < len(bodies):
            await asyncio.wait_for(link.arrived.wait(), 10)
            link.arrived.clear()
            while link.buffer:
                raw = link.buffer.popleft()
                assert raw.message_id not in got, f"{raw.message_id} came twice"
                got[raw.message_id] = raw.body
                await link.ack(raw.gen, [raw.tag])
        assert got == bodies
        assert handed, "no delivery was taken off the socket"
        assert max(handed) > 3 * frame_max, "no delivery of several body frames was taken"
    finally:
        await link.drop()
        try:
            await (await conn.channel()).queue_delete(name)
        finally:
            await conn.close()
