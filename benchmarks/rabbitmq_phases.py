"""Where the wall time of a one-at-a-time confirmed publish goes, for the bare
aiormq client and for ``await task.aenqueue(i)`` on RabbitMQ: before its
frames reach the socket (``pre``: from the call to the transport's first
``write``), waiting for the broker (``wait``: from that write to the first
bytes read back, the confirm), and after (``post``: from those bytes to the
call's return).  Medians of ``N`` calls, alternated per repetition.

    .venv/bin/python benchmarks/rabbitmq_phases.py [--reps 3] [-n 1000]
    .venv/bin/python benchmarks/rabbitmq_phases.py --no-record   # the record's write skipped

``--no-record`` replaces the state store's ``kv_add`` by one that writes
nothing, to show what the record's write costs the ``wait`` (its CPU and
disk write compete with RabbitMQ's on this machine's two cores and one
disk).  Queues under the prefix ``dwph`` and ``dw-ph-bare`` (deleted at the
end), the state store in ``/tmp``.  Run it under the benchmarks' flock.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from asyncio import selector_events
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiormq
from pamqp import commands as spec
from rabbitmq_enqueue import AMQP, delete_topology, noop_app

STATE = "/tmp/dwphase-state.db"
BARE_QUEUE = "dw-ph-bare"

#: when this call's frames were first written, and its first bytes read back
_marks = {"write": 0.0, "read": 0.0}
_TRANSPORT: Any = selector_events._SelectorSocketTransport  # type: ignore[attr-defined]
_write = _TRANSPORT.write
_feed = asyncio.StreamReader.feed_data


def _marked_write(self: Any, data: Any) -> None:
    if not _marks["write"]:
        _marks["write"] = time.perf_counter()
    _write(self, data)


def _marked_feed(self: asyncio.StreamReader, data: bytes) -> None:
    if not _marks["read"]:
        _marks["read"] = time.perf_counter()
    _feed(self, data)


async def _phases(call: Callable[[int], Awaitable[Any]], n: int) -> str:
    pre, wait, post = [], [], []
    for i in range(n):
        _marks["write"] = _marks["read"] = 0.0
        t0 = time.perf_counter()
        await call(i)
        t3 = time.perf_counter()
        w, r = _marks["write"], _marks["read"]
        if w and r > w:
            pre.append(w - t0)
            wait.append(r - w)
            post.append(t3 - r)

    def us(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e6:.0f}" if xs else "-"

    return f"pre {us(pre)}  wait {us(wait)}  post {us(post)} us  (n={len(pre)})"


def _fresh_state() -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(STATE + suffix).unlink(missing_ok=True)


async def main(n: int, reps: int, record: bool) -> None:
    _fresh_state()
    app, noop = noop_app("dwph", STATE)
    await noop.aenqueue(-1)  # connects, declares
    broker: Any = app.broker
    if not record:

        async def nothing(key: str, value: bytes, ttl: float | None = None) -> bool:
            return True

        broker.state.kv_add = nothing
    _TRANSPORT.write = _marked_write
    asyncio.StreamReader.feed_data = _marked_feed  # type: ignore[method-assign,assignment]
    conn = await aiormq.connect(AMQP)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(BARE_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        props = spec.Basic.Properties(delivery_mode=2)

        async def bare(i: int) -> None:
            await ch.basic_publish(b"x" * 300, routing_key=BARE_QUEUE, properties=props)

        for rep in range(1, reps + 1):
            print(f"rep {rep}: bare     {await _phases(bare, n)}")
            print(f"rep {rep}: aenqueue {await _phases(noop.aenqueue, n)}")
    finally:
        _TRANSPORT.write = _write
        asyncio.StreamReader.feed_data = _feed  # type: ignore[method-assign]
        await ch.queue_delete(BARE_QUEUE)
        await delete_topology(ch, broker)
        await conn.close()
        await app.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-record", action="store_true", help="skip the record's write")
    args = p.parse_args()
    asyncio.run(main(args.n, args.reps, not args.no_record))
