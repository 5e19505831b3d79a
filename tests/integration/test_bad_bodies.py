"""A body that is not UTF-8, put on each broker behind its back, is
dead-lettered with a reason that says so (the byte and its offset), not with
the JSON parser's "str is not valid UTF-8: surrogates not allowed".

The reason is worked out above the broker seam (the worker, from the body
the broker hands it), so this runs on every broker that stores bodies as
bytes; each has its own way to put one there, as a foreign producer or a
damaged record would.  The good job beside it still runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import dumbwaiter as dw
from dumbwaiter.errors import MessageDecodeError
from dumbwaiter.message import ErrorRecord
from tests.brokers import BROKERS, CROSS_PROCESS

BODY = b'{"id": "\xff", "kind": "task"}'
REASON = "message body is not valid UTF-8 (byte 0xff at offset 8: invalid start byte)"


async def _sqlite(app: dw.App, job: str) -> None:
    import sqlite3

    conn = sqlite3.connect(app.url.removeprefix("sqlite:///"))
    conn.execute("UPDATE dw_jobs SET body = ? WHERE id = ?", (BODY, job))
    conn.commit()
    conn.close()


async def _postgres(app: dw.App, job: str) -> None:
    import psycopg
    from psycopg import sql

    from tests.integration.postgres.server import SERVER

    schema = app.broker.schema  # type: ignore[attr-defined]
    async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {}.dw_jobs SET body = %s WHERE id = %s").format(sql.Identifier(schema)),
            (BODY, job),
        )


async def _redis(app: dw.App, job: str) -> None:
    broker: Any = app.broker
    conn = broker.keyspace("default").conn
    await conn.links.get().call(b"HSET", conn.keys.job(job), b"body", BODY)


async def _rabbitmq(app: dw.App, job: str) -> None:
    """A foreign producer's message on the queue (a stored one cannot be changed)."""
    import aiormq
    from pamqp.commands import Basic

    from tests.integration.rabbitmq.server import amqp_base

    broker: Any = app.broker
    conn = await aiormq.connect(amqp_base())
    try:
        ch = await conn.channel(publisher_confirms=True)
        props = Basic.Properties(message_id="bad-1", delivery_mode=2)
        await ch.basic_publish(BODY, routing_key=broker.names.lane("default"), properties=props)
    finally:
        await conn.close()


async def _nats(app: dw.App, job: str) -> None:
    """A pointer whose body is not an envelope (a stored record is JSON itself)."""
    broker: Any = app.broker
    link = await broker._link()
    headers = ((b"Dw-Id", "bad-1"), (b"Dw-G", "0"))
    await link.store.put(broker.n.pointer("default", 0), BODY, None, headers)


async def _kafka(app: dw.App, job: str) -> None:
    """A foreign producer's record on the queue's topic (no dw-id header)."""
    from tests.integration.kafka.server import put_foreign

    await put_foreign(app, "default", BODY)


#: put a body that is not UTF-8 on the broker: over job ``job``'s, or beside it
PUT: dict[str, Callable[[dw.App, str], Awaitable[None]]] = {
    "sqlite": _sqlite,
    "postgres": _postgres,
    "redis": _redis,
    "redis-queues": _redis,
    "rabbitmq": _rabbitmq,
    "nats": _nats,
    "kafka": _kafka,
}
assert set(PUT) == set(CROSS_PROCESS), "a broker joined: give it a way to put a raw body"


class DeadLetters(dw.Middleware):
    def __init__(self) -> None:
        self.records: list[ErrorRecord] = []
        self.changed = asyncio.Event()

    def on_dead(self, ctx: dw.Context | None, error: ErrorRecord) -> None:
        self.records.append(error)
        self.changed.set()


@pytest.mark.parametrize("broker", sorted(PUT))
async def test_a_body_that_is_not_utf8_is_dead_lettered_saying_so(
    broker: str, tmp_path: Path
) -> None:
    app = dw.App(BROKERS[broker](tmp_path), retry=dw.Retry.never())
    dead = DeadLetters()
    app.use(dead)
    ran = asyncio.Event()

    @app.task
    def fine(i: int) -> None:
        ran.set()

    await app.broker.declare(["default"])
    await fine.aenqueue(1)
    await PUT[broker](app, (await fine.aenqueue(2)).id)
    worker = dw.Worker(app, queues=("default",), concurrency=4)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(dead.changed.wait(), 60)
        await asyncio.wait_for(ran.wait(), 60)
    finally:
        worker.stop()
        await running
        await app.aclose()
    [error] = dead.records
    assert error.type == f"{MessageDecodeError.__module__}.{MessageDecodeError.__qualname__}"
    assert error.message.startswith(REASON), error.message
