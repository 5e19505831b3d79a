"""Small helpers for conformance tests: waiting on conditions, not on sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dumbwaiter.brokers.base import Broker
from dumbwaiter.brokers.types import Delivery
from dumbwaiter.message import ErrorRecord

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], timeout: float = 10.0
) -> T:
    """Call ``probe`` until ``accept`` holds for its value (or fail after ``timeout``).

    Used where time itself must pass (a lease or an eta running out), or
    where only the engine's own state shows what happened."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if accept(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in {timeout} s; last value {value!r}")
        await asyncio.sleep(0.02)


async def until_fetch_waits(broker: Broker, queue: str = "default") -> None:
    """Until an idle ``fetch`` of ``broker`` on ``queue`` waits for work: a
    job enqueued from then on must wake it (one enqueued before would just
    be found by its first look).  Each engine shows a waiting fetch its own
    way: the memory store's waiters, SQLite's armed WAL watch, Redis'
    ``waiters:<queue>`` set, PostgreSQL's ``dw_waiters`` rows, a consumer on
    RabbitMQ's lane, an open long-poll request of a NATS puller."""
    name = type(broker).__name__
    probe = _WAITING.get(name)
    if probe is None:
        raise AssertionError(f"until_fetch_waits: how does a {name} fetch wait? (tests helpers)")
    await eventually(lambda: probe(broker, queue), bool)


async def _memory_waits(broker: Any, queue: str) -> bool:
    return bool(broker.store.waiters)


async def _sqlite_waits(broker: Any, queue: str) -> bool:
    return bool(broker._wakers)  # made and armed by the first fetch that waits


async def _redis_waits(broker: Any, queue: str) -> bool:
    conn = broker.keyspace(queue).conn
    return bool(await conn.links.get().call(b"ZCARD", conn.keys.waiters(queue)))


async def _postgres_waits(broker: Any, queue: str) -> bool:
    import psycopg

    query = f'SELECT count(*) FROM "{broker.opts.schema}".dw_waiters'
    async with await psycopg.AsyncConnection.connect(broker.opts.conninfo) as conn:
        row = await (await conn.execute(query.encode())).fetchone()
    return bool(row and row[0])


async def _rabbitmq_waits(broker: Any, queue: str) -> bool:
    import aiormq

    conn = await aiormq.connect(broker.amqp_url)
    try:
        ok = await (await conn.channel()).queue_declare(broker.names.lane(queue), passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False  # the fetch has not declared it yet
    finally:
        await conn.close()
    return bool(ok.consumer_count)


async def _nats_waits(broker: Any, queue: str) -> bool:
    return any(
        p.polls
        for _, link in broker._links.items()
        for (q, _level), p in link.pullers.items()
        if q == queue  # not the delay promoter's puller, which always waits
    )


async def _kafka_waits(broker: Any, queue: str) -> bool:
    return any(r.waiting for _, link in broker._links.items() for r in link.readers.values())


_WAITING: dict[str, Callable[[Any, str], Awaitable[bool]]] = {
    "MemoryBroker": _memory_waits,
    "SQLiteBroker": _sqlite_waits,
    "RedisBroker": _redis_waits,
    "PostgresBroker": _postgres_waits,
    "RabbitMQBroker": _rabbitmq_waits,
    "NatsBroker": _nats_waits,
    "KafkaBroker": _kafka_waits,
}


async def fetch_all(broker: Broker, queue: str = "default", lease: float = 30.0) -> list[Delivery]:
    out: list[Delivery] = []
    while True:
        ds = await broker.fetch([queue], 100, lease, 0)
        if not ds:
            return out
        out += ds


def error(
    kind: str = "builtins.ValueError", message: str = "boom", attempt: int = 1
) -> ErrorRecord:
    return ErrorRecord(
        time=time.time(),
        type=kind,
        message=message,
        traceback="Traceback (most recent call last):\n  ...\nValueError: boom\n",
        worker="test-worker",
        attempt=attempt,
    )
