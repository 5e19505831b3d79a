"""The broker's private hooks stay on its own connections: a user's aiormq or
aio-pika connection in the same process, made after an App on amqp:// has
enqueued and fetched (both hooks used), is aiormq's own and works as without
dumbwaiter (brokers/hooks.py, docs/benchmarks.md "Private hooks").

The check runs in a fresh interpreter, so it sees aiormq and pamqp as they
were before dumbwaiter was imported at all."""

from __future__ import annotations

from pathlib import Path

from tests.integration.rabbitmq import server
from tests.integration.untouched import run_fresh

SCRIPT = r"""
import asyncio
import sys

import aio_pika
import aiormq
import aiormq.channel
import aiormq.connection
import pamqp.frame


OWNERS = {
        "aiormq": aiormq,
        "aiormq.connection": aiormq.connection,
        "aiormq.channel": aiormq.channel,
        "pamqp.frame": pamqp.frame,
        "Connection": aiormq.connection.Connection,
        "Channel": aiormq.channel.Channel,
        "FrameReceiver": aiormq.connection.FrameReceiver,
    }


before = snapshot(OWNERS)


async def own_connections(base):
    # aio-pika: publish with confirms, consume through a callback
    conn = await aio_pika.connect(base)
    try:
        ch = await conn.channel(publisher_confirms=True)
        raw = await ch.get_underlay_channel()
        assert [n for n in vars(raw) if callable(getattr(type(raw), n, None))] == []
        assert type(raw.frames) is asyncio.Queue
        q = await ch.declare_queue(exclusive=True)
        got = asyncio.get_running_loop().create_future()

        async def on_message(m):
            async with m.process():
                got.set_result((m.body, m.headers, m.message_id))

        await q.consume(on_message)
        msg = aio_pika.Message(b"mine", headers={"k": "v", "n": 7}, message_id="m1")
        await ch.default_exchange.publish(msg, routing_key=q.name)
        assert await asyncio.wait_for(got, 30) == (b"mine", {"k": "v", "n": 7}, "m1")
    finally:
        await conn.close()
    # aiormq: basic_publish with confirms, basic_get
    conn = await aiormq.connect(base)
    try:
        ch = await conn.channel(publisher_confirms=True)
        assert [n for n in vars(ch) if callable(getattr(type(ch), n, None))] == []
        ok = await ch.queue_declare(exclusive=True)
        props = aiormq.spec.Basic.Properties(headers={"x": "y"}, message_id="m2")
        r = await ch.basic_publish(b"also mine", routing_key=ok.queue, properties=props)
        assert isinstance(r, aiormq.spec.Basic.Ack)
        m = await ch.basic_get(ok.queue, no_ack=True)
        assert (m.body, m.header.properties.headers, m.header.properties.message_id) == (
            b"also mine", {"x": "y"}, "m2")
    finally:
        await conn.close()


async def main(url, base):
    app = await one_job(url)
    link = app.broker._links.current()
    assert link is not None
    assert link.fast_publish and link.inline and link.wire is not None  # the hooks were on
    touched = changed(before, snapshot(OWNERS))
    assert touched == [], touched
    await own_connections(base)
    await app.aclose()
    print("ok")


asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_a_users_own_connections_are_aiormqs_beside_the_broker(tmp_path: Path) -> None:
    url = server.rabbitmq_url(tmp_path)
    run_fresh(SCRIPT, url, server.amqp_base())
